//! Which policy a request falls under, from what it carries without any change to the
//! client: the team its base URL or a header names, its API key's fingerprint, the client,
//! the model and the API.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::dialect::Dialect;
use crate::glob;
pub use crate::names::team_name;

/// The `match` table of a policy. Every selector given must hold (and); within one
/// selector's list, any pattern may (or). Patterns are globs (`crate::glob`). A policy
/// with no selector never matches on its own: it is a base other policies inherit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// `/t/{team}` in the base URL, or the `x-loopwarden-team` header; in any case (a team
    /// is one team however its name is written: [`team_of`]).
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub team: Vec<String>,
    /// The API key's fingerprint, as `loopwarden key-id` prints it.
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub key_id: Vec<String>,
    /// The client, as [`Client::as_str`] names it.
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub client: Vec<String>,
    /// The `user-agent` header (for a client the list above does not name).
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub user_agent: Vec<String>,
    /// The model the request asks for.
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub model: Vec<String>,
    /// The wire format: `openai_chat`, `openai_responses`, `anthropic`, `gemini`.
    #[serde(
        default,
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub api: Vec<String>,
}

/// `"x"` or `["x", "y"]`: a user writing one value should not need the brackets.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// What a request says about itself that policies match on.
#[derive(Debug, Clone, Default)]
pub struct Traffic<'a> {
    /// As [`team_of`] gives it.
    pub team: Option<Cow<'a, str>>,
    /// The key's fingerprint, worked out only when some policy matches on keys.
    pub key_id: Option<String>,
    pub client: Client,
    pub user_agent: &'a str,
    pub model: Option<&'a str>,
    pub api: Option<Dialect>,
}

/// What the log keeps of a conversation's traffic (`conversations`: its team, client,
/// model and API), by which `loopwarden replay --db` finds the policy a config puts it
/// under ([`super::PolicySet::select_logged`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Logged {
    pub team: Option<String>,
    /// As [`Client::as_str`] names it.
    pub client: Option<String>,
    pub model: Option<String>,
    /// As [`Dialect::as_str`] names it.
    pub api: Option<String>,
}

/// The header that names a request's team when its base URL cannot (`/t/{team}` wins).
pub const TEAM_HEADER: &str = "x-loopwarden-team";

impl<'a> Traffic<'a> {
    /// What a request carries that policies match on, but the model (known once the body
    /// is read); its team as [`team_of`] reads it from the route's `/t/{team}` segment
    /// (`team_prefix`) or the header. The key's fingerprint is worked out only when
    /// `with_key_id`.
    pub fn of(
        headers: &'a http::HeaderMap,
        team_prefix: Option<&'a str>,
        query: Option<&'a str>,
        api: Option<Dialect>,
        with_key_id: bool,
    ) -> Traffic<'a> {
        let user_agent = user_agent(headers);
        Traffic {
            team: team_of(headers, team_prefix),
            key_id: with_key_id
                .then(|| super::key_id::key_of(headers, query).map(super::key_id::of))
                .flatten(),
            client: Client::of(user_agent),
            user_agent,
            model: None,
            api,
        }
    }

    /// The same traffic asking for `model` (read from the body or the path).
    pub fn with_model<'b>(&self, model: Option<&'b str>) -> Traffic<'b>
    where
        'a: 'b,
    {
        Traffic {
            model,
            ..self.clone()
        }
    }
}

/// A request's `user-agent` (empty when it has none, or none in ASCII).
pub fn user_agent(headers: &http::HeaderMap) -> &str {
    headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The team a request names: its `/t/{team}` prefix (percent-decoded, as a URL path
/// segment is: `/t/my%20team` is `my team`), else its `x-loopwarden-team` header; as
/// [`team_name`] writes it. One place, so that policies match, the log records and
/// `loopwarden policies --team` explains the same name.
pub fn team_of<'a>(
    headers: &'a http::HeaderMap,
    team_prefix: Option<&'a str>,
) -> Option<Cow<'a, str>> {
    let raw = match team_prefix {
        Some(segment) => percent_encoding::percent_decode_str(segment).decode_utf8_lossy(),
        None => {
            // Named once: a name given as text is parsed on each look-up.
            const TEAM: http::HeaderName = http::HeaderName::from_static(TEAM_HEADER);
            Cow::Borrowed(headers.get(TEAM)?.to_str().ok()?.trim())
        }
    };
    Some(team_name(raw))
}

/// The clients loopwarden knows by their `user-agent` (CLIENTS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Client {
    ClaudeCode,
    Codex,
    GeminiCli,
    Opencode,
    /// mini-swe-agent speaks through litellm or the OpenAI Python SDK and names itself in
    /// neither: any client of those two counts as it.
    MiniSweAgent,
    #[default]
    Other,
}

impl Client {
    pub const ALL: [Client; 6] = [
        Client::ClaudeCode,
        Client::Codex,
        Client::GeminiCli,
        Client::Opencode,
        Client::MiniSweAgent,
        Client::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Client::ClaudeCode => "claude-code",
            Client::Codex => "codex",
            Client::GeminiCli => "gemini-cli",
            Client::Opencode => "opencode",
            Client::MiniSweAgent => "mini-swe-agent",
            Client::Other => "other",
        }
    }

    /// The client a `user-agent` names.
    pub fn of(user_agent: &str) -> Client {
        let prefixes: [(&str, Client); 7] = [
            ("claude-cli/", Client::ClaudeCode),
            ("codex", Client::Codex),
            ("GeminiCLI", Client::GeminiCli),
            ("opencode/", Client::Opencode),
            ("litellm/", Client::MiniSweAgent),
            ("OpenAI/Python", Client::MiniSweAgent),
            ("mini-swe-agent", Client::MiniSweAgent),
        ];
        prefixes
            .iter()
            .find(|(p, _)| user_agent.starts_with(p))
            .map_or(Client::Other, |(_, c)| *c)
    }
}

impl Selector {
    /// Whether the policy has anything to match on.
    pub fn is_empty(&self) -> bool {
        self.team.is_empty()
            && self.key_id.is_empty()
            && self.client.is_empty()
            && self.user_agent.is_empty()
            && self.model.is_empty()
            && self.api.is_empty()
    }

    /// Whether a request falls under it. An empty selector matches nothing.
    pub fn matches(&self, traffic: &Traffic<'_>) -> bool {
        !self.is_empty()
            && (self.team.is_empty() || traffic.team.as_deref().is_some_and(|t| self.names_team(t)))
            && any(&self.key_id, traffic.key_id.as_deref())
            && any(&self.client, Some(traffic.client.as_str()))
            && any(&self.user_agent, Some(traffic.user_agent))
            && any(&self.model, traffic.model)
            && any(&self.api, traffic.api.map(Dialect::as_str))
    }

    /// Whether one of its `team` patterns holds for `team` (as [`team_name`] writes it):
    /// the policies a team's admin token sees as its own, and what `loopwarden run --team`
    /// looks for before it starts the command.
    pub fn names_team(&self, team: &str) -> bool {
        self.team.iter().any(|p| glob::matches_any_case(p, team))
    }

    /// Whether a logged conversation falls under it; `None` when it matches on what the
    /// log does not keep (the key's fingerprint, the `user-agent` itself).
    pub fn matches_logged(&self, logged: &Logged) -> Option<bool> {
        if !self.key_id.is_empty() || !self.user_agent.is_empty() {
            return None;
        }
        let client = Client::ALL
            .into_iter()
            .find(|c| Some(c.as_str()) == logged.client.as_deref())
            .unwrap_or_default();
        let api = Dialect::ALL
            .into_iter()
            .find(|d| Some(d.as_str()) == logged.api.as_deref());
        let traffic = Traffic {
            team: logged.team.as_deref().map(Cow::Borrowed),
            key_id: None,
            client,
            user_agent: "",
            model: logged.model.as_deref(),
            api,
        };
        Some(self.matches(&traffic))
    }

    /// Whether every request `later` matches is matched by this selector too (so that
    /// `later`, tried after it, never applies). Conservative: true only when each selector
    /// this one has is one `later` has too, and each of `later`'s patterns there is one of
    /// this one's patterns matches as text (`ci*` covers `ci-nightly` and `ci-*`; `*`
    /// covers all). Teams compare in any case, as they match.
    pub fn covers(&self, later: &Selector) -> bool {
        fn field(mine: &[String], theirs: &[String], any_case: bool) -> bool {
            let matches = if any_case {
                glob::matches_any_case
            } else {
                glob::matches
            };
            mine.is_empty()
                || (!theirs.is_empty() && theirs.iter().all(|t| mine.iter().any(|m| matches(m, t))))
        }
        !self.is_empty()
            && !later.is_empty()
            && field(&self.team, &later.team, true)
            && field(&self.key_id, &later.key_id, false)
            && field(&self.client, &later.client, false)
            && field(&self.user_agent, &later.user_agent, false)
            && field(&self.model, &later.model, false)
            && field(&self.api, &later.api, false)
    }

    /// Checks the values: clients and APIs from their vocabularies, key ids as printed.
    pub fn validate(&self) -> Result<(), String> {
        let clients: Vec<&str> = Client::ALL.iter().map(|c| c.as_str()).collect();
        if let Some(c) = self.client.iter().find(|c| !clients.contains(&c.as_str())) {
            return Err(format!(
                "`match.client`: {c:?} is not a client loopwarden knows ({}); `match.user_agent` matches any other",
                clients.join(", ")
            ));
        }
        let apis: Vec<&str> = Dialect::ALL.iter().map(|d| d.as_str()).collect();
        if let Some(a) = self.api.iter().find(|a| !apis.contains(&a.as_str())) {
            return Err(format!("`match.api`: {a:?} is none of {}", apis.join(", ")));
        }
        if let Some(k) = self.key_id.iter().find(|k| !super::key_id::looks_like(k)) {
            return Err(format!(
                "`match.key_id`: {k:?} is not a key id (`loopwarden key-id` prints one: {} hex digits)",
                super::key_id::LEN
            ));
        }
        Ok(())
    }
}

/// No patterns: anything (the selector does not ask). Patterns: a value, matching one.
fn any(patterns: &[String], value: Option<&str>) -> bool {
    patterns.is_empty() || value.is_some_and(|v| patterns.iter().any(|p| glob::matches(p, v)))
}
