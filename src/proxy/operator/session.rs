//! The dashboard's login session: the cookie `POST /ui/login` sets in place of the token a
//! browser cannot send, which the admin API and the pages accept ([`super::admin::access`]).
//!
//! What it is, and why:
//! - **Random per login, with an expiry**: `NONCE.EXPIRES.MAC`, a random nonce, the end of
//!   its life (Unix seconds, [`LIFETIME`] after the login) and a keyed hash of both under a
//!   key derived from the token it stands for. A cookie seen once cannot be reused past its
//!   expiry, and no two logins share one.
//! - **Revoked when the token changes**: the key is the token's, so a proxy started with
//!   another token (the admin tokens change only at a restart) accepts none made before.
//!   Nothing is stored: every replica holding the same token accepts the cookie any of them
//!   made (replicas behind a load balancer, no stickiness).
//! - **Sent to the proxy's own paths only**: two cookies of the same name, `Path=/ui` and
//!   `Path=/admin` (a cookie has one path), so that a browser sends neither with a request
//!   for any other path, which would be forwarded to the model's provider. And whatever a
//!   client sends, `crate::own_cookie::strip` takes loopwarden's cookie out of every forwarded request.
//! - `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page sends it),
//!   `Secure` when the proxy is reached over HTTPS.

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};

use crate::own_cookie::{values, COOKIE};

/// How long a login lasts: a working day.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// The paths the cookie is sent to: the dashboard's pages and the admin API they call.
const PATHS: [&str; 2] = ["/ui", "/admin"];

/// Bytes of a session's random nonce.
const NONCE_BYTES: usize = 16;

/// The key a token's sessions are signed with (never the token itself).
fn key(token: &str) -> [u8; 32] {
    blake3::derive_key("loopwarden 2026 dashboard session key", token.as_bytes())
}

/// The keyed hash of a session's nonce and expiry, hex.
fn mac(token: &str, nonce: &str, expires: u64) -> String {
    let mut hasher = blake3::Hasher::new_keyed(&key(token));
    hasher.update(nonce.as_bytes());
    hasher.update(b".");
    hasher.update(expires.to_string().as_bytes());
    hasher.finalize().to_hex().to_string()
}

/// A new session for `token`, valid until `now + LIFETIME` (Unix seconds): the cookie's
/// value. `None` when the system's random source fails (no session then, rather than a
/// guessable one).
pub fn new_value(token: &str, now: u64) -> Option<String> {
    let mut nonce = [0u8; NONCE_BYTES];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut nonce)
        .ok()?;
    let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let expires = now + LIFETIME.as_secs();
    Some(format!("{nonce}.{expires}.{}", mac(token, &nonce, expires)))
}

/// The `Set-Cookie` values that give a browser the session `value`, one per path.
pub fn set_cookies(value: &str, secure: bool) -> Vec<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    PATHS
        .iter()
        .filter_map(|path| {
            let cookie = format!(
                "{COOKIE}={value}; Path={path}; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
                LIFETIME.as_secs()
            );
            HeaderValue::from_str(&cookie).ok()
        })
        .collect()
}

/// Whether `value` is a session of `token` still valid at `now` (Unix seconds).
fn valid(value: &str, token: &str, now: u64) -> bool {
    let mut parts = value.split('.');
    let (Some(nonce), Some(expires), Some(given), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    nonce.len() == 2 * NONCE_BYTES
        && now < expires
        && constant_time_eq(given.as_bytes(), mac(token, nonce, expires).as_bytes())
}

/// Whether the request carries a session of `token` valid at `now` (Unix seconds).
pub fn presented(headers: &HeaderMap, token: &str, now: u64) -> bool {
    values(headers).any(|value| valid(value, token, now))
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether two secrets are equal, in a time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::own_cookie::tests::with_cookie;

    #[test]
    fn a_session_is_random_per_login_expires_and_dies_with_its_token() {
        let now = 1_800_000_000;
        let one = new_value("tok", now).unwrap();
        let two = new_value("tok", now).unwrap();
        assert_ne!(one, two, "random per login");
        assert!(!one.contains("tok"));
        let headers = with_cookie(&format!("a=b; {COOKIE}={one}"));
        assert!(presented(&headers, "tok", now));
        assert!(presented(&headers, "tok", now + LIFETIME.as_secs() - 1));
        assert!(
            !presented(&headers, "tok", now + LIFETIME.as_secs()),
            "expired"
        );
        assert!(!presented(&headers, "another", now), "another token");
        // The expiry cannot be moved: it is under the hash.
        let (nonce, rest) = one.split_once('.').unwrap();
        let (_, mac) = rest.split_once('.').unwrap();
        let later = format!("{nonce}.{}.{mac}", now + 10 * LIFETIME.as_secs());
        assert!(!presented(
            &with_cookie(&format!("{COOKIE}={later}")),
            "tok",
            now
        ));
        for odd in ["", "x", "a.b.c", "a.1.b.c", &format!("{nonce}.{now}")] {
            assert!(!presented(
                &with_cookie(&format!("{COOKIE}={odd}")),
                "tok",
                now
            ));
        }
    }

    #[test]
    fn the_cookie_is_scoped_to_the_proxy_s_paths() {
        let cookies = set_cookies("v", false);
        let text: Vec<&str> = cookies.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(text.len(), 2);
        assert!(text[0].contains("Path=/ui;") && text[1].contains("Path=/admin;"));
        for cookie in &text {
            assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
            assert!(cookie.contains(&format!("Max-Age={}", LIFETIME.as_secs())));
            assert!(!cookie.contains("Secure"));
        }
        assert!(set_cookies("v", true)[0]
            .to_str()
            .unwrap()
            .ends_with("; Secure"));
    }
}
