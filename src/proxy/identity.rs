//! Which conversation a request belongs to.
//!
//! In order: our own header `x-loopwarden-conversation`; a `/c/{id}` path prefix; the ids
//! clients send (Claude Code session + sub-agent, Codex thread, opencode session); else a
//! hash of the history's stable head (first system text + first user message), which every
//! client resends unchanged until it compacts. Within a run, detection reads the transcript
//! itself, so a wrong identity only mislabels the log. Across a compaction the run is
//! followed by its markers (`super::memory::lineage`), which never joins two runs on a
//! guess.

use http::HeaderMap;

use crate::transcript::Transcript;

/// A conversation id and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Safe to echo in a header: printable ASCII without spaces, at most [`MAX_ID_LEN`].
    pub id: String,
    pub source: IdSource,
}

/// Where a conversation id came from (`conversations.id_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// A header the client sent (one of [`ID_HEADERS`]), named as the log shows it.
    Header(&'static str),
    /// A `/c/{id}` path prefix.
    Path,
    /// A hash of the history's stable head.
    HeadHash,
    /// Nothing to go by: one bucket per client and endpoint.
    Fallback,
}

impl IdSource {
    pub fn as_str(self) -> &'static str {
        match self {
            IdSource::Header(name) => name,
            IdSource::Path => "path",
            IdSource::HeadHash => "head_hash",
            IdSource::Fallback => "fallback",
        }
    }
}

pub const HEADER: &str = "x-loopwarden-conversation";
const MAX_ID_LEN: usize = 128;

/// The headers that state a conversation id, in one list so that one pass over the
/// request's headers finds them all (five lookups by name parsed and hashed each name:
/// ~1.7k instructions per request, a tenth of that as one pass).
const ID_HEADERS: [&str; 6] = [
    HEADER,
    "x-claude-code-session-id",
    "x-claude-code-agent-id",
    "thread-id",
    "session-id",
    "x-session-id",
];

/// The identity a request states explicitly (header or path), if any.
pub fn stated(headers: &HeaderMap, path_id: Option<&str>) -> Option<Identity> {
    // The first value of each of `ID_HEADERS` (what `HeaderMap::get` returns).
    let mut first: [Option<&http::HeaderValue>; ID_HEADERS.len()] = [None; ID_HEADERS.len()];
    for (name, value) in headers {
        if let Some(i) = ID_HEADERS.iter().position(|n| *n == name.as_str()) {
            first[i].get_or_insert(value);
        }
    }
    let header = |name: &str| {
        let i = ID_HEADERS.iter().position(|n| *n == name)?;
        first[i]
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if let Some(id) = header(HEADER) {
        return Some(make(id, IdSource::Header(HEADER)));
    }
    if let Some(id) = path_id.filter(|id| !id.is_empty()) {
        return Some(make(id, IdSource::Path));
    }
    if let Some(session) = header("x-claude-code-session-id") {
        // Sub-agents share the session id; their own history makes them a conversation
        // of their own.
        return Some(match header("x-claude-code-agent-id") {
            Some(agent) => make(
                &format!("{session}:{agent}"),
                IdSource::Header("x-claude-code-session-id"),
            ),
            None => make(session, IdSource::Header("x-claude-code-session-id")),
        });
    }
    // Codex sends one value as thread-id and session-id; the thread survives `resume`.
    for name in ["thread-id", "session-id", "x-session-id"] {
        if let Some(id) = header(name) {
            return Some(make(id, IdSource::Header(name)));
        }
    }
    None
}

/// The identity of a conversation that states none: a hash of its stable head.
pub fn from_head(transcript: &Transcript) -> Option<Identity> {
    let system = transcript.system.first().map(String::as_str).unwrap_or("");
    let task = transcript.task.first().map(String::as_str).unwrap_or("");
    if system.is_empty() && task.is_empty() {
        return None;
    }
    let mut h = blake3::Hasher::new();
    h.update(system.as_bytes());
    h.update(b"\0");
    h.update(task.as_bytes());
    Some(Identity {
        id: format!("h-{}", &h.finalize().to_hex()[..16]),
        source: IdSource::HeadHash,
    })
}

impl Identity {
    /// The identity within `team`'s namespace (the team a policy matches on): one the
    /// proxy derived (a head hash, the fallback) gets the team in front, so that two teams
    /// running the same task with the same system prompt are two conversations, each with
    /// its own halts and budget. An id the client stated is its own and unique already.
    pub fn in_team(self, team: Option<&str>) -> Identity {
        let Some(team) = team.filter(|t| !t.is_empty()) else {
            return self;
        };
        match self.source {
            IdSource::Header(_) | IdSource::Path => self,
            IdSource::HeadHash | IdSource::Fallback => {
                let team = make(team, self.source).id;
                Identity {
                    id: format!("{team}:{}", self.id),
                    source: self.source,
                }
            }
        }
    }
}

/// Last resort for a request with no id and no readable history: one bucket per client
/// and endpoint, so such requests are at least grouped, not lost.
pub fn fallback(headers: &HeaderMap, path: &str) -> Identity {
    let agent = headers
        .get(http::header::USER_AGENT)
        .map(|v| v.as_bytes())
        .unwrap_or(b"");
    let mut h = blake3::Hasher::new();
    h.update(agent);
    h.update(b"\0");
    h.update(path.as_bytes());
    Identity {
        id: format!("anon-{}", &h.finalize().to_hex()[..16]),
        source: IdSource::Fallback,
    }
}

/// Keeps a client's id as it is when it is a plain token (so users can find it in the
/// log), else replaces it by a hash (so it is always safe in a header and a URL).
fn make(raw: &str, source: IdSource) -> Identity {
    let plain = raw.len() <= MAX_ID_LEN
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@+=".contains(&b));
    let id = if plain {
        raw.to_string()
    } else {
        format!("x-{}", &blake3::hash(raw.as_bytes()).to_hex()[..16])
    };
    Identity { id, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn explicit_ids_in_order_of_precedence() {
        let claude = headers(&[("x-claude-code-session-id", "s1")]);
        assert_eq!(stated(&claude, None).unwrap().id, "s1");
        let sub = headers(&[
            ("x-claude-code-session-id", "s1"),
            ("x-claude-code-agent-id", "a9"),
        ]);
        assert_eq!(stated(&sub, None).unwrap().id, "s1:a9");
        assert_eq!(
            stated(&sub, Some("p")).unwrap(),
            Identity {
                id: "p".into(),
                source: IdSource::Path
            }
        );
        let ours = headers(&[(HEADER, "mine"), ("thread-id", "t")]);
        assert_eq!(stated(&ours, Some("p")).unwrap().id, "mine");
        let codex = headers(&[("session-id", "t1"), ("thread-id", "t1")]);
        assert_eq!(
            stated(&codex, None).unwrap().source,
            IdSource::Header("thread-id")
        );
        let opencode = headers(&[("x-session-id", "ses_1")]);
        assert_eq!(stated(&opencode, None).unwrap().id, "ses_1");
        assert_eq!(stated(&headers(&[]), None), None);
    }

    #[test]
    fn only_the_first_value_of_an_id_header_counts() {
        let mut h = headers(&[("user-agent", "x"), ("thread-id", "t1")]);
        h.append("thread-id", "t2".parse().unwrap());
        assert_eq!(stated(&h, None).unwrap().id, "t1");
        // An empty first value states nothing, even with a second one; the next name counts.
        let mut h = headers(&[("x-session-id", "ses_1")]);
        h.append(HEADER, " ".parse().unwrap());
        h.append(HEADER, "mine".parse().unwrap());
        h.append("session-id", "".parse().unwrap());
        assert_eq!(stated(&h, None).unwrap().id, "ses_1");
        // Not valid UTF-8 text: skipped the same way.
        let mut h = headers(&[("thread-id", "t1")]);
        h.insert(
            "x-claude-code-session-id",
            http::HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        assert_eq!(
            stated(&h, None).unwrap().source,
            IdSource::Header("thread-id")
        );
    }

    #[test]
    fn unsafe_ids_are_hashed() {
        let odd = headers(&[(HEADER, "a b/c")]);
        let id = stated(&odd, None).unwrap().id;
        assert!(id.starts_with("x-") && !id.contains(' '), "{id}");
        assert_eq!(make(&"a".repeat(200), IdSource::Path).id.len(), 18);
    }

    #[test]
    fn head_hash_depends_on_system_and_task_only() {
        let mut t = Transcript {
            system: vec!["sys".into()],
            task: vec!["fix the bug".into()],
            ..Transcript::default()
        };
        let a = from_head(&t).unwrap();
        t.task.push("later".into());
        assert_eq!(from_head(&t).unwrap(), a);
        t.task[0] = "another task".into();
        assert_ne!(from_head(&t).unwrap(), a);
        assert_eq!(from_head(&Transcript::default()), None);
    }
}
