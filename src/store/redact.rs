//! Short, redacted evidence for the log. Tool arguments and results can hold anything an
//! agent saw (environment dumps, config files), so what the log keeps of them is a one-line
//! summary with anything that looks like a credential masked, plus a hash of the full text.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

const MASK: &str = "[redacted]";

/// Patterns of credentials, each replaced by `$keep` + MASK.
const PATTERNS: [&str; 9] = [
    // `Bearer <token>`, `key=...`, `"api_key": "..."`, `password: ...`: keep the name.
    r#"(?i)(?P<keep>\bbearer\s+)[^\s"',;]+"#,
    r#"(?i)(?P<keep>[?&](?:key|api_key|token|access_token)=)[^&\s"']+"#,
    r#"(?i)(?P<keep>\b[\w-]*(?:api[_-]?key|token|secret|passw(?:or)?d|authorization|credential)s?\b["']?\s*[:=]\s*["']?)[^\s"',;&]+"#,
    // Well-known key formats (OpenAI/Anthropic sk-, Google AIza, GitHub, Slack, AWS).
    r"(?P<keep>)\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}",
    r"(?P<keep>)\bAIza[0-9A-Za-z_-]{20,}",
    r"(?P<keep>)\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{16,}",
    r"(?P<keep>)\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"(?P<keep>)\bAKIA[0-9A-Z]{16}\b",
    // Any long unbroken token (keys, JWT parts): better masked than kept.
    r"(?P<keep>)\b[A-Za-z0-9_\-]{40,}",
];

static SECRETS: LazyLock<Vec<Regex>> =
    LazyLock::new(|| PATTERNS.iter().filter_map(|p| Regex::new(p).ok()).collect());

/// All the patterns in one automaton: most texts hold no credential, and one pass over
/// them says so (the nine patterns one by one were 3,100 of the 4,800 instructions of a
/// tool call's summary; the set and the rest of the summary now take 2,100).
static ANY_SECRET: LazyLock<Option<RegexSet>> = LazyLock::new(|| RegexSet::new(PATTERNS).ok());

/// Compiles the patterns now, so the first request that needs them does not pay for it.
pub fn warm_up() {
    LazyLock::force(&SECRETS);
    LazyLock::force(&ANY_SECRET);
}

/// Masks credentials in `text`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    // No pattern matches the text: none matches after a replacement either, as there is none.
    if ANY_SECRET.as_ref().is_some_and(|set| !set.is_match(text)) {
        return out;
    }
    for re in SECRETS.iter() {
        if re.is_match(&out) {
            out = re
                .replace_all(&out, |c: &regex::Captures| {
                    format!("{}{MASK}", c.name("keep").map_or("", |m| m.as_str()))
                })
                .into_owned();
        }
    }
    out
}

/// One line of at most `max_chars` characters: whitespace runs collapsed, credentials
/// masked, cut with `…` when longer. Only a bounded prefix of the input is looked at.
pub fn summary(text: &str, max_chars: usize) -> String {
    summary_of(&[text], max_chars)
}

/// [`summary`] of the texts one after the other, without first copying them into one.
pub fn summary_of(texts: &[&str], max_chars: usize) -> String {
    // Redacting the whole of a 1 MB tool result would be wasted work: look at a prefix a
    // little longer than what is kept (masking can only shorten long tokens).
    let mut line = String::with_capacity(max_chars * 2);
    let mut last_space = true;
    for c in texts.iter().flat_map(|t| t.chars()) {
        if c.is_whitespace() {
            if !last_space {
                line.push(' ');
            }
            last_space = true;
        } else {
            line.push(c);
            last_space = false;
        }
        if line.len() >= max_chars * 4 {
            break;
        }
    }
    let redacted = redact(line.trim_end());
    if redacted.chars().count() <= max_chars {
        return redacted;
    }
    let mut cut: String = redacted.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_credentials_and_keeps_the_rest() {
        let cases = [
            (
                "curl -H 'Authorization: Bearer abc.def-123' x",
                "abc.def-123",
            ),
            (
                "export OPENAI_API_KEY=sk-proj-ABCDEFGH12345678",
                "sk-proj-ABCDEFGH",
            ),
            (
                "GET /v1beta/models?key=AIzaSyA0123456789abcdefghij",
                "AIzaSyA0",
            ),
            (r#"{"api_key": "hunter2hunter2"}"#, "hunter2"),
            ("password=swordfish ok", "swordfish"),
            ("token ghp_0123456789abcdefghijklmn", "ghp_0123"),
        ];
        for (input, secret) in cases {
            let out = redact(input);
            assert!(!out.contains(secret), "{input:?} -> {out:?}");
            assert!(out.contains(MASK), "{out:?}");
        }
        assert_eq!(
            redact("cat src/main.rs | head -5"),
            "cat src/main.rs | head -5"
        );
    }

    #[test]
    fn summary_is_one_bounded_line() {
        let s = summary(
            "line one\n\n  line   two\twith sk-ant-api03-SECRETSECRET",
            30,
        );
        assert!(s.chars().count() <= 30, "{s}");
        assert!(s.starts_with("line one line two"), "{s}");
        let s = summary("pytest -q\n    sk-ant-api03-SECRETSECRET", 200);
        assert_eq!(s, "pytest -q [redacted]");
        // In pieces, as one text: whitespace runs and secrets across the joins.
        let whole = "Bash:  \n export KEY=sk-ant-api03-SECRETSECRET  ok";
        for cut in 0..whole.len() {
            let (a, b) = whole.split_at(cut);
            assert_eq!(summary_of(&[a, b], 30), summary(whole, 30), "{cut}");
        }
        assert_eq!(summary(whole, 200), "Bash: export KEY=[redacted] ok");
        let long = "x ".repeat(10_000);
        assert!(summary(&long, 50).ends_with('…'));
    }
}
