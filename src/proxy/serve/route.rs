//! Where a request goes: which upstream, which path, which wire format, the conversation a
//! `/c/{id}` prefix names and the team a `/t/{team}` prefix names. Pure functions of the request line and headers.

use std::borrow::Cow;

use http::{HeaderMap, Uri};

use crate::dialect::Dialect;

/// The three API families, each with one base URL from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Upstream {
    pub fn as_str(self) -> &'static str {
        match self {
            Upstream::OpenAi => "openai",
            Upstream::Anthropic => "anthropic",
            Upstream::Gemini => "gemini",
        }
    }

    fn from_prefix(segment: &str) -> Option<Upstream> {
        match segment {
            "openai" => Some(Upstream::OpenAi),
            "anthropic" => Some(Upstream::Anthropic),
            "gemini" => Some(Upstream::Gemini),
            _ => None,
        }
    }

    /// The API family that speaks a wire format natively.
    fn of(dialect: Dialect) -> Upstream {
        match dialect {
            Dialect::OpenAiChat | Dialect::OpenAiResponses => Upstream::OpenAi,
            Dialect::Anthropic => Upstream::Anthropic,
            Dialect::Gemini => Upstream::Gemini,
        }
    }
}

/// The routing of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Route<'a> {
    pub upstream: Upstream,
    /// The path to forward: the request's path with loopwarden's prefixes removed.
    pub path: &'a str,
    /// The query string, forwarded as is (never logged: it may carry `key=`).
    pub query: Option<&'a str>,
    /// The conversation named by a `/c/{id}` prefix.
    pub conversation: Option<&'a str>,
    /// The team named by a `/t/{team}` prefix (what policies match on: `crate::policy`).
    pub team: Option<&'a str>,
    /// The wire format when the path is a conversation endpoint, and whether the path
    /// itself asks for a stream (Gemini `:streamGenerateContent`).
    pub dialect: Option<(Dialect, bool)>,
}

/// Routes a request. Prefixes `/t/{team}`, `/c/{id}` and `/openai|/anthropic|/gemini` may
/// come in any order, each at most once; each is removed before forwarding. A second
/// `/t/{team}` (a base URL with the team set twice) is removed too, the first one naming
/// the team: no upstream path starts with `/t/`, and forwarded it would reach the upstream
/// as a 404 naming the team.
pub fn route<'a>(uri: &'a Uri, headers: &HeaderMap) -> Route<'a> {
    let mut path = uri.path();
    let mut conversation = None;
    let mut team = None;
    let mut second_team = None;
    let mut explicit = None;
    loop {
        let (first, rest) = split_first_segment(path);
        let named = match first {
            "c" if conversation.is_none() => Some(&mut conversation),
            "t" if team.is_none() => Some(&mut team),
            "t" => Some(&mut second_team),
            _ => None,
        };
        if let Some(slot) = named {
            let (name, rest) = split_first_segment(rest);
            if name.is_empty() {
                break;
            }
            *slot = Some(name);
            path = rest;
        } else if let Some(upstream) = Upstream::from_prefix(first).filter(|_| explicit.is_none()) {
            explicit = Some(upstream);
            path = rest;
        } else {
            break;
        }
    }
    if path.is_empty() {
        path = "/";
    }
    let dialect = Dialect::from_path(path);
    let upstream = explicit
        .or_else(|| dialect.map(|(d, _)| Upstream::of(d)))
        .unwrap_or_else(|| upstream_of_other(path, uri.query(), headers));
    Route {
        upstream,
        path,
        query: uri.query(),
        conversation,
        team,
        dialect,
    }
}

/// Whether a request asks to become a WebSocket (RFC 6455 §4.1): a `GET` with
/// `Upgrade: websocket` and a `Connection` header that lists `upgrade`. Codex opens the
/// Responses API so (`GET /v1/responses`).
pub fn asks_websocket(method: &http::Method, headers: &HeaderMap) -> bool {
    let lists = |name: http::header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    method == http::Method::GET
        && lists(http::header::UPGRADE, "websocket")
        && lists(http::header::CONNECTION, "upgrade")
}

/// A path whose `..` segments climb above its root. Forwarded, it would leave the upstream
/// base URL's path prefix: `https://gateway/openai` + `/v1/../../admin` is the gateway's
/// `/admin` once the gateway resolves the segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClimbsOut;

/// `uri` with its path's dot segments (`.` and `..`, each dot plain or as `%2e`) resolved as
/// RFC 3986 §5.2.4 does, in origin form; `ClimbsOut` when a `..` would go above the root.
/// What is forwarded (the base's path prefix, then this path) then stays under the prefix,
/// whatever the upstream makes of dot segments. Borrowed when the path has none, which is
/// every real client's.
pub fn resolve_dots(uri: &Uri) -> Result<Cow<'_, Uri>, ClimbsOut> {
    let path = uri.path();
    // A dot segment starts with `.` or `%` after a slash; model names have dots elsewhere.
    let maybe = path.contains("/.") || path.contains("/%");
    if !maybe || !path.split('/').any(|s| dots(s).is_some()) {
        return Ok(Cow::Borrowed(uri));
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut segments = path.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        match dots(segment) {
            None => {
                kept.push(segment);
                continue;
            }
            Some(Dots::One) => {}
            Some(Dots::Two) => {
                kept.pop().ok_or(ClimbsOut)?;
            }
        }
        // `/a/b/..` is `/a/`: a dot segment at the end leaves the slash before it.
        if segments.peek().is_none() {
            kept.push("");
        }
    }
    let mut resolved = String::with_capacity(path.len() + 1 + uri.query().map_or(0, str::len));
    for segment in &kept {
        resolved.push('/');
        resolved.push_str(segment);
    }
    if resolved.is_empty() {
        resolved.push('/');
    }
    if let Some(query) = uri.query() {
        resolved.push('?');
        resolved.push_str(query);
    }
    // Made of the valid URI's own characters, so it parses; were it not to, refusing is
    // the safe answer.
    Uri::try_from(resolved)
        .map(Cow::Owned)
        .map_err(|_| ClimbsOut)
}

/// A dot segment: `.` or `..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dots {
    One,
    Two,
}

/// Whether a path segment is `.` or `..`, each dot written `.`, `%2e` or `%2E`.
fn dots(segment: &str) -> Option<Dots> {
    let mut rest = segment;
    let mut count = 0;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            rest = after;
        } else if rest.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("%2e")) {
            rest = &rest[3..];
        } else {
            return None;
        }
        count += 1;
    }
    match count {
        1 => Some(Dots::One),
        2 => Some(Dots::Two),
        _ => None,
    }
}

/// `"/a/b/c"` → `("a", "/b/c")`; `"/a"` → `("a", "")`.
fn split_first_segment(path: &str) -> (&str, &str) {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    match trimmed.find('/') {
        Some(i) => (&trimmed[..i], &trimmed[i..]),
        None => (trimmed, ""),
    }
}

/// The upstream of a path that is not a conversation endpoint: known API paths first,
/// then the request's auth style.
fn upstream_of_other(path: &str, query: Option<&str>, headers: &HeaderMap) -> Upstream {
    if path.starts_with("/v1/messages/") || path == "/v1/complete" {
        return Upstream::Anthropic;
    }
    let gemini_method =
        path.contains("/models/") && path.rsplit('/').next().is_some_and(|s| s.contains(':'));
    if path.starts_with("/v1beta/") || path.starts_with("/v1alpha/") || gemini_method {
        return Upstream::Gemini;
    }
    if headers.contains_key("x-api-key") && headers.contains_key("anthropic-version") {
        return Upstream::Anthropic;
    }
    let key_in_query = query.is_some_and(|q| q.split('&').any(|p| p.starts_with("key=")));
    if headers.contains_key("x-goog-api-key") || key_in_query {
        return Upstream::Gemini;
    }
    Upstream::OpenAi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (Upstream, String, Option<String>, Option<(Dialect, bool)>) {
        let uri: Uri = uri.parse().unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let route = route(&uri, &map);
        (
            route.upstream,
            route.path.to_string(),
            route.conversation.map(str::to_string),
            route.dialect,
        )
    }

    #[test]
    fn conversation_endpoints_choose_their_api() {
        use Dialect as D;
        use Upstream as U;
        assert_eq!(r("/v1/chat/completions", &[]).0, U::OpenAi);
        assert_eq!(
            r("/v1/chat/completions", &[]).3,
            Some((D::OpenAiChat, false))
        );
        assert_eq!(r("/v1/responses", &[]).3, Some((D::OpenAiResponses, false)));
        let (u, p, _, d) = r("/v1/messages?beta=true", &[]);
        assert_eq!(
            (u, p.as_str(), d),
            (U::Anthropic, "/v1/messages", Some((D::Anthropic, false)))
        );
        let (u, _, _, d) = r(
            "/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse",
            &[],
        );
        assert_eq!((u, d), (U::Gemini, Some((D::Gemini, true))));
        let (u, _, _, d) = r("/v1/models/gemini-3.8-flash:generateContent", &[]);
        assert_eq!((u, d), (U::Gemini, Some((D::Gemini, false))));
    }

    #[test]
    fn other_paths_go_by_known_path_then_auth_style() {
        use Upstream::*;
        assert_eq!(r("/v1/messages/count_tokens", &[]).0, Anthropic);
        assert_eq!(r("/v1/messages/count_tokens", &[]).3, None);
        assert_eq!(r("/v1beta/models/g:countTokens", &[]).0, Gemini);
        assert_eq!(r("/v1/models", &[]).0, OpenAi);
        assert_eq!(
            r(
                "/v1/models",
                &[("x-api-key", "k"), ("anthropic-version", "2023-06-01")]
            )
            .0,
            Anthropic
        );
        assert_eq!(r("/v1/models", &[("x-goog-api-key", "k")]).0, Gemini);
        assert_eq!(r("/v1/models?key=abc", &[]).0, Gemini);
    }

    #[test]
    fn prefixes_are_stripped_in_either_order() {
        use Upstream::*;
        let (u, p, c, d) = r("/c/run-42/v1/chat/completions", &[]);
        assert_eq!(
            (u, p.as_str(), c.as_deref()),
            (OpenAi, "/v1/chat/completions", Some("run-42"))
        );
        assert!(d.is_some());
        let (u, p, c, _) = r("/anthropic/c/abc/v1/chat/completions", &[]);
        assert_eq!(
            (u, p.as_str(), c.as_deref()),
            (Anthropic, "/v1/chat/completions", Some("abc"))
        );
        let (u, p, c, _) = r("/c/abc/gemini/v1beta/models/x:generateContent?key=1", &[]);
        assert_eq!(
            (u, p.as_str(), c.as_deref()),
            (Gemini, "/v1beta/models/x:generateContent", Some("abc"))
        );
        let (u, p, _, _) = r("/openai", &[]);
        assert_eq!((u, p.as_str()), (OpenAi, "/"));
        // Only one of each prefix is loopwarden's; a second one belongs to the path.
        let (_, p, c, _) = r("/c/a/c/b/x", &[]);
        assert_eq!((p.as_str(), c.as_deref()), ("/c/b/x", Some("a")));
        // A team named twice: the first names it, neither is forwarded.
        let uri: Uri = "/t/a/c/x/t/b/v1/chat/completions".parse().unwrap();
        let routed = route(&uri, &HeaderMap::new());
        assert_eq!(routed.path, "/v1/chat/completions");
        assert_eq!(routed.team, Some("a"));
        assert_eq!(routed.conversation, Some("x"));
    }

    #[test]
    fn a_websocket_upgrade_needs_get_upgrade_and_connection() {
        let headers = |pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            map
        };
        let get = http::Method::GET;
        let codex = headers(&[("upgrade", "websocket"), ("connection", "Upgrade")]);
        assert!(asks_websocket(&get, &codex));
        let listed = headers(&[
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, upgrade"),
        ]);
        assert!(asks_websocket(&get, &listed));
        assert!(!asks_websocket(&http::Method::POST, &codex));
        assert!(!asks_websocket(&get, &headers(&[("upgrade", "websocket")])));
        let h2c = headers(&[("upgrade", "h2c"), ("connection", "upgrade")]);
        assert!(!asks_websocket(&get, &h2c));
    }

    #[test]
    fn dot_segments_are_resolved_and_a_climb_above_the_root_refused() {
        let resolved = |uri: &str| {
            let uri: Uri = uri.parse().unwrap();
            resolve_dots(&uri).map(|u| u.to_string())
        };
        for (uri, expected) in [
            ("/v1/models", "/v1/models"),
            (
                "/v1beta/models/gemini-2.5-pro:generateContent",
                "/v1beta/models/gemini-2.5-pro:generateContent",
            ),
            ("/v1/engines/../models?limit=2", "/v1/models?limit=2"),
            ("/v1/./models", "/v1/models"),
            ("/v1/%2e/models/%2E%2E/models", "/v1/models"),
            ("/v1/models/..", "/v1/"),
            ("/v1/models/.", "/v1/models/"),
            ("/v1/..", "/"),
            ("/.", "/"),
            ("/c/run/../v1/chat/completions", "/c/v1/chat/completions"),
            ("/v1/...", "/v1/..."),
            ("/v1/..models", "/v1/..models"),
            ("/v1/%2e%2e%2e", "/v1/%2e%2e%2e"),
            ("http://relay.example/v1/../models", "/models"),
        ] {
            assert_eq!(resolved(uri).as_deref(), Ok(expected), "{uri}");
        }
        for uri in [
            "/..",
            "/v1/../..",
            "/v1/../../admin",
            "/%2e%2e/x",
            "/v1/.%2E/%2e./x",
            "/a/./../../b",
        ] {
            assert_eq!(resolved(uri), Err(ClimbsOut), "{uri}");
        }
        // No dot segment: the very same URI, not a copy.
        let uri: Uri = "/v1/chat/completions".parse().unwrap();
        assert!(matches!(resolve_dots(&uri), Ok(Cow::Borrowed(_))));
    }
}
