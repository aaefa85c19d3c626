//! loopwarden's own cookie on a request (the dashboard's session, `proxy::operator`): its
//! name, its values among the `Cookie` headers, and its removal from a request about to be
//! forwarded (`proxy::forward`). Below both, so that neither room imports the other.

use http::header::{self, HeaderMap, HeaderValue};

/// The session cookie's name.
pub const COOKIE: &str = "loopwarden_session";

/// The values of loopwarden's cookie among the `Cookie` headers.
pub fn values(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// Takes loopwarden's cookie out of `headers` (a request about to be forwarded): a
/// `Cookie` header that holds only it goes, one that holds others too keeps them. Cheap
/// when there is no `Cookie` header, as on every agent's request.
pub fn strip(headers: &mut HeaderMap) {
    if !headers.contains_key(header::COOKIE) || values(headers).next().is_none() {
        return;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| {
            let Ok(text) = v.to_str() else {
                return Some(v.clone());
            };
            let others: Vec<&str> = text
                .split(';')
                .map(str::trim)
                .filter(|pair| pair.split_once('=').is_none_or(|(name, _)| name != COOKIE))
                .filter(|pair| !pair.is_empty())
                .collect();
            (!others.is_empty())
                .then(|| HeaderValue::from_str(&others.join("; ")).ok())
                .flatten()
        })
        .collect();
    headers.remove(header::COOKIE);
    for value in kept {
        headers.append(header::COOKIE, value);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Headers holding one `Cookie` header of `cookie`.
    pub(crate) fn with_cookie(cookie: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(cookie).unwrap());
        headers
    }

    #[test]
    fn only_loopwarden_s_cookie_is_stripped() {
        let mut headers = with_cookie(&format!("a=1; {COOKIE}=s; b=2"));
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("loopwarden_session=t"),
        );
        headers.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        strip(&mut headers);
        let left: Vec<&str> = headers
            .get_all(header::COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(left, ["a=1; b=2"]);
        assert!(headers.contains_key(header::AUTHORIZATION));
        let mut none = HeaderMap::new();
        strip(&mut none);
        assert!(none.is_empty());
    }
}
