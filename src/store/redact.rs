//! Masked text for the log. Tool arguments and results can hold anything an agent saw
//! (environment dumps, config files), and what detection says about them quotes them, so
//! every text from a conversation that loopwarden keeps or shows is [`Masked`]: anything
//! that looks like a credential replaced by `[redacted]`. Of tool arguments and results the
//! log keeps a one-line masked summary ([`summary`]) and a hash of the full text.

use std::borrow::Cow;
use std::sync::LazyLock;

use aho_corasick::AhoCorasick;
use regex::{Regex, RegexSet};
use serde::Serialize;

const MASK: &str = "[redacted]";

/// Text that comes from a conversation (what an agent ran, read, wrote or was told, and
/// what loopwarden says about it) with anything that looks like a credential masked.
///
/// Every such text that the log stores, the proxy writes to stderr or the admin API and
/// the webhooks serve is a `Masked`: the log's rows, a held request's listing and a sticky
/// halt's reason hold their texts as this type, and the only ways to build one mask. So
/// masking is not a call each place has to remember: a place that forgot would not compile.
/// (The reminders sent to the model are plain strings: the model saw the text first. A
/// halt reply is masked: it ends the run, and is read in terminals and CI logs.) Masking is idempotent, so text read back from the log is masked again on the
/// way out, which also covers logs written before a pattern was added.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Masked(String);

impl Masked {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `value` as JSON text with credentials masked in each of its strings (object keys
    /// too). Masking the JSON text as a whole could cut across its quotes and escapes (a
    /// PEM block runs to the end of the text when its last line was masked) and leave it
    /// unreadable; string by string, the text stays JSON and reads back as `value`'s type.
    pub fn json(value: &impl Serialize) -> Masked {
        let mut value = serde_json::to_value(value).unwrap_or_default();
        mask_strings(&mut value);
        Masked(serde_json::to_string(&value).unwrap_or_default())
    }
}

/// Masks every string in a JSON value, in place.
fn mask_strings(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let Cow::Owned(masked) = mask(s) {
                *s = masked;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_strings),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut v) in entries {
                mask_strings(&mut v);
                map.insert(mask(&key).into_owned(), v);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

impl From<&str> for Masked {
    fn from(text: &str) -> Masked {
        Masked(redact(text))
    }
}

impl From<String> for Masked {
    /// Keeps the string's allocation when nothing in it needs masking (most texts).
    fn from(text: String) -> Masked {
        match mask(&text) {
            Cow::Borrowed(_) => Masked(text),
            Cow::Owned(masked) => Masked(masked),
        }
    }
}

/// Read back (a spill file, `super::spill`) through [`From<String>`]: masked again.
impl<'de> serde::Deserialize<'de> for Masked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Masked, D::Error> {
        String::deserialize(d).map(Masked::from)
    }
}

impl std::ops::Deref for Masked {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Masked {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Display for Masked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A credential pattern: what it matches is replaced by its `keep` group and the mask,
/// when `is_secret` says the match is one.
///
/// Names are matched ignoring ASCII case only (`(?i-u:token)`), as their anchors are found
/// (a Unicode `(?i)` would also take the Kelvin sign for a `k`). Word boundaries and word
/// characters are ASCII (`(?-u:\b)`, `[A-Za-z0-9_]`): a Unicode
/// `\b` stops the lazy DFA at the first byte that is not ASCII and leaves the search to a
/// slower engine, which cost a 1 KB summary 60 times as much; credentials are ASCII anyway.
struct Pattern {
    regex: &'static str,
    is_secret: fn(&str) -> bool,
    group: Group,
    /// For a [`Group::Named`] pattern, words one of which every match holds (ASCII case
    /// ignored): a text with none of them is not searched with the pattern at all.
    anchors: &'static [&'static str],
}

/// How a text is first checked for a pattern's possible match (see [`mask`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    /// A credential named (`token=`) or with a known prefix (`sk-`, `AIza`): first its
    /// anchors are looked for ([`ANCHORS`]).
    Named,
    /// A long unbroken run of token characters: one automaton of both ([`LONG_RUNS`]).
    LongRun,
}

const PATTERNS: [Pattern; 14] = [
    // `Bearer <token>`, `key=...`, `"api_key": "..."`, `password: ...`,
    // `aws_secret_access_key = ...`: keep the name.
    Pattern::named(
        r#"(?P<keep>(?-u:\b)(?i-u:bearer)\s+)[^\s"',;]+"#,
        &["bearer"],
    ),
    Pattern::named(
        r#"(?P<keep>[?&](?i-u:key|api_key|token|access_token)=)[^&\s"']+"#,
        &["key=", "token="],
    ),
    Pattern::named(
        r#"(?P<keep>(?-u:\b)[A-Za-z0-9_-]*(?i-u:api[_-]?key|access[_-]?key|private[_-]?key|token|secret|passw(?:or)?d|passphrase|authorization|credential)[A-Za-z0-9_-]*["']?\s*[:=]\s*["']?)[^\s"',;&]+"#,
        &[
            "key",
            "token",
            "secret",
            "passw",
            "passphrase",
            "authorization",
            "credential",
        ],
    ),
    // A PEM private key, from its first line to its last (or the end of the text, when a
    // summary cut it short).
    Pattern::named(
        r"(?P<keep>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)(?s:.)*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
        &["-----BEGIN "],
    ),
    // Well-known key formats: OpenAI and Anthropic `sk-`, Stripe, Google `AIza` and OAuth
    // `ya29.`, GitHub, Slack, AWS access key ids, JSON Web Tokens (header and payload are
    // enough: a cut one is still masked).
    Pattern::named(
        r"(?P<keep>)(?-u:\b)(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}",
        &["sk-", "pk-", "rk-"],
    ),
    Pattern::named(
        r"(?P<keep>)(?-u:\b)(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{8,}",
        &["_live_", "_test_"],
    ),
    Pattern::named(r"(?P<keep>)(?-u:\b)AIza[0-9A-Za-z_-]{20,}", &["AIza"]),
    Pattern::named(r"(?P<keep>)(?-u:\b)ya29\.[0-9A-Za-z_-]{20,}", &["ya29."]),
    Pattern::named(
        r"(?P<keep>)(?-u:\b)(?:ghp|gho|ghs|ghu|ghr|github_pat)_[A-Za-z0-9_]{16,}",
        &["ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"],
    ),
    Pattern::named(r"(?P<keep>)(?-u:\b)xox[abprse]-[A-Za-z0-9-]{10,}", &["xox"]),
    Pattern::named(
        r"(?P<keep>)(?-u:\b)(?:AKIA|ASIA)[0-9A-Z]{16}(?-u:\b)",
        &["AKIA", "ASIA"],
    ),
    Pattern::named(
        r"(?P<keep>)(?-u:\b)eyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*)?",
        &["eyJ"],
    ),
    // Any long unbroken token (keys, JWT parts): better masked than kept.
    Pattern {
        regex: r"(?P<keep>)(?-u:\b)[A-Za-z0-9_\-]{40,}",
        is_secret: always,
        group: Group::LongRun,
        anchors: &[],
    },
    // A long base64 run (a key's body, an AWS secret key): masked when it reads like
    // random bytes, not like a path (`/usr/lib/python3/site-packages/...`).
    Pattern {
        regex: r"(?P<keep>)[A-Za-z0-9+/]{40,}={0,2}",
        is_secret: looks_random,
        group: Group::LongRun,
        anchors: &[],
    },
];

impl Pattern {
    /// A named or prefixed pattern whose every match is a credential.
    const fn named(regex: &'static str, anchors: &'static [&'static str]) -> Pattern {
        Pattern {
            regex,
            is_secret: always,
            group: Group::Named,
            anchors,
        }
    }
}

fn always(_: &str) -> bool {
    true
}

/// Base64 of random bytes mixes upper case, lower case and digits, with a `/` about once
/// in 64 characters; a path has one every few characters.
fn looks_random(run: &str) -> bool {
    let has = |f: fn(&char) -> bool| run.chars().any(|c| f(&c));
    let slashes = run.bytes().filter(|&b| b == b'/').count();
    has(char::is_ascii_uppercase)
        && has(char::is_ascii_lowercase)
        && has(char::is_ascii_digit)
        && slashes * 16 <= run.len()
}

/// A compiled pattern and its test of a match.
type Compiled = (Regex, fn(&str) -> bool);

// A pattern is a bit of [`candidates`]' answer.
const _: () = assert!(PATTERNS.len() <= 32);

/// One per [`PATTERNS`] entry, in its order (`None`: a pattern that did not compile, which
/// a test rules out).
static SECRETS: LazyLock<Vec<Option<Compiled>>> = LazyLock::new(|| {
    PATTERNS
        .iter()
        .map(|p| Regex::new(p.regex).ok().map(|re| (re, p.is_secret)))
        .collect()
});

/// The [`Group::Named`] patterns' anchors, as one automaton of plain words: most texts
/// hold none, and one pass says so. Not the patterns themselves: a pattern such as
/// `[A-Za-z0-9_-]*(?:token|secret|…)` tracks a partial match of every name at each
/// character of an identifier, so each new random id (a tool call's `call_x7Q…`, on every
/// request) built new lazy-DFA states, about 3 K instructions a text.
/// Beside the automaton, the [`PATTERNS`] index of each anchor's pattern.
static ANCHORS: LazyLock<Option<(AhoCorasick, Vec<usize>)>> = LazyLock::new(|| {
    let owners = PATTERNS
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.anchors.iter().map(move |_| i))
        .collect();
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(PATTERNS.iter().flat_map(|p| p.anchors))
        .ok()
        .map(|automaton| (automaton, owners))
});

/// The [`Group::LongRun`] patterns as one automaton. Apart from the named ones: together,
/// their counted runs (`{8,}`, `{20,}`, `{40,}`) multiplied into more lazy-DFA states than
/// its cache holds.
static LONG_RUNS: LazyLock<Option<RegexSet>> = LazyLock::new(|| {
    RegexSet::new(
        PATTERNS
            .iter()
            .filter(|p| p.group == Group::LongRun)
            .map(|p| p.regex),
    )
    .ok()
});

/// Compiles the patterns now, so the first request that needs them does not pay for it.
pub fn warm_up() {
    LazyLock::force(&SECRETS);
    LazyLock::force(&ANCHORS);
    LazyLock::force(&LONG_RUNS);
}

/// Masks credentials in `text`.
pub fn redact(text: &str) -> String {
    mask(text).into_owned()
}

/// `text` with credentials masked; borrowed when there is none.
fn mask(text: &str) -> Cow<'_, str> {
    let candidates = candidates(text);
    // No pattern matches the text: none matches after a replacement either, as there is none.
    if candidates == 0 {
        return Cow::Borrowed(text);
    }
    let mut out = Cow::Borrowed(text);
    for (i, compiled) in SECRETS.iter().enumerate() {
        let Some((re, is_secret)) = compiled.as_ref().filter(|_| candidates & 1 << i != 0) else {
            continue;
        };
        if re.is_match(&out) {
            let replaced = re.replace_all(&out, |c: &regex::Captures| {
                let whole = c.get(0).map_or("", |m| m.as_str());
                if !is_secret(whole) {
                    return whole.to_string();
                }
                format!("{}{MASK}", c.name("keep").map_or("", |m| m.as_str()))
            });
            out = Cow::Owned(replaced.into_owned());
        }
    }
    out
}

/// The patterns that may match `text`, a bit per [`PATTERNS`] index: the named ones whose
/// anchor it holds, and the long-run ones when one of them matches. Every pattern when an
/// automaton failed to build (a test rules it out): masking too much beats too little.
fn candidates(text: &str) -> u32 {
    let mut bits = 0u32;
    match ANCHORS.as_ref() {
        // A plain search first: most texts hold no anchor, and where it finds none the
        // overlapping search (dearer to set up and to step) would find none either.
        Some((automaton, owners)) if automaton.is_match(text) => {
            for m in automaton.find_overlapping_iter(text) {
                bits |= 1 << owners[m.pattern().as_usize()];
            }
        }
        Some(_) => {}
        None => bits = u32::MAX,
    }
    if LONG_RUNS.as_ref().is_none_or(|set| set.is_match(text)) {
        for (i, p) in PATTERNS.iter().enumerate() {
            if p.group == Group::LongRun {
                bits |= 1 << i;
            }
        }
    }
    bits
}

/// One line of at most `max_chars` characters: whitespace runs collapsed, credentials
/// masked, cut with `…` when longer. Only a bounded prefix of the input is looked at.
pub fn summary(text: &str, max_chars: usize) -> Masked {
    summary_of(&[text], max_chars)
}

/// [`summary`] of the texts one after the other, without first copying them into one.
pub fn summary_of(texts: &[&str], max_chars: usize) -> Masked {
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
        return Masked(redacted);
    }
    let mut cut: String = redacted.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    Masked(cut)
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
    fn every_common_key_shape_is_masked_and_paths_and_hashes_of_code_are_kept() {
        // (text, the part that must go)
        let cases = [
            ("key sk-proj-Q2x7VbN4kL9mT1rZ8wY3uH6p here", "Q2x7VbN4"),
            ("sk-ant-api03-Xq8Lm2Nv7Bc4Zt9Rw1Ys6Hd3Kf0", "Xq8Lm2Nv"),
            ("AIzaSyD4m7Qx2Lk9Vb1Nw8Zr5Tc3Hy6Pf0Gj", "D4m7Qx2L"),
            ("ya29.a0AfH6SMBx3Lk9Vb1Nw8Zr5Tc3Hy6", "a0AfH6SM"),
            ("id AKIAQ4X7M2L9V1N8Z5T3 denied", "Q4X7M2L9"),
            ("temporary ASIAQ4X7M2L9V1N8Z5T3", "Q4X7M2L9"),
            (
                "aws_secret_access_key = Wq7Lm2Nv9Bc4/Zt1Rw8Ys3Hd6+Kf0Pg5JjXa2Qe7U",
                "Wq7Lm2Nv",
            ),
            ("a bare Wq7Lm2Nv9Bc4/Zt1Rw8Ys3Hd6+Kf0Pg5JjXa2Qe7U secret", "Wq7Lm2Nv"),
            ("ghp_Lm3Nv8Bc5Zt2Rw9Ys4Hd7Kf1Pg6JjXa3Qe8", "Lm3Nv8Bc"),
            ("github_pat_11ABCDEFG0123456789_abcdefghij", "11ABCDEFG"),
            ("xoxb-2048-4096-Nv4Bc6Zt3Rw0Ys5Hd8Kf2", "Nv4Bc6Zt"),
            ("sk_live_51HxQ2x7VbN4kL9mT1rZ", "51HxQ2x7"),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq8Lm2Nv7/Bc4Zt9Rw1+Ys6Hd3Kf0\nTn6Rm3Lk8Jh5\n-----END RSA PRIVATE KEY----- done",
                "Tn6Rm3Lk",
            ),
            // A PEM block a summary cut short.
            ("-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAA", "b3BlbnNz"),
            ("password: Hunter2-Swordfish-77", "Hunter2"),
            ("DB_PASSWORD=Hunter2-Swordfish-77", "Hunter2"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0.Tq9Vb2Nw5Zr8Lk1Xc4Hy7Pf0Gj3",
                "eyJzdWIi",
            ),
            // A JSON Web Token cut short is still one.
            ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2", "eyJzdWIi"),
        ];
        for (input, secret) in cases {
            let out = redact(input);
            assert!(!out.contains(secret), "{input:?} -> {out:?}");
            assert!(out.contains(MASK), "{out:?}");
        }
        assert_eq!(redact("done"), "done");
        for kept in [
            "/usr/lib/python3/site-packages/loopwarden/proxy/forward/handler.py",
            "FAILED test_calc.py::test_add - AssertionError: add(2, 2) returned 0",
            "see https://example.com/docs/a/b/c/d/e/f/g/h/i/j/k/l/m/n",
        ] {
            assert_eq!(redact(kept), kept);
        }
    }

    #[test]
    fn credentials_beside_text_that_is_not_ascii_are_masked() {
        // The boundaries are ASCII: a letter that is not ASCII next to a key is no word
        // character, so the key is still found.
        for (input, secret) in [
            ("✓ sk-proj-Q2x7VbN4kL9mT1rZ8wY3 ✓", "Q2x7VbN4"),
            ("clé:éAKIAQ4X7M2L9V1N8Z5T3é", "Q4X7M2L9"),
            ("Überprüfung token=Hunter2-Swordfish-77 fertig", "Hunter2"),
            ("→ Bearer abc.def-123 ←", "abc.def-123"),
        ] {
            let out = redact(input);
            assert!(!out.contains(secret), "{input:?} -> {out:?}");
        }
        assert_eq!(redact("naïve café ✓ ok"), "naïve café ✓ ok");
    }

    #[test]
    fn every_pattern_and_automaton_builds() {
        assert!(SECRETS.iter().all(Option::is_some));
        assert!(ANCHORS.is_some() && LONG_RUNS.is_some());
        assert!(PATTERNS
            .iter()
            .all(|p| (p.group == Group::Named) != p.anchors.is_empty()));
    }

    #[test]
    fn random_ids_need_no_search() {
        // What every request carries (tool call ids) is not searched with the patterns.
        for id in [
            "call_t30_0_zIEuY0dUjwvRv6lD",
            "toolu_01HXq8ZfP3mW",
            "chatcmpl-9x2Lq",
        ] {
            assert_eq!(candidates(id), 0, "{id}");
        }
    }

    proptest::proptest! {
        /// A named pattern is skipped when none of its anchors is in the text: so each of
        /// its matches must hold one, which this checks on texts made of the patterns'
        /// own pieces.
        #[test]
        fn every_named_match_holds_one_of_its_anchors(
            text in "((?i)bearer |key=|token|secret|passwd|password|api_key|apikey|-----BEGIN RSA PRIVATE KEY-----|sk-|pk_live_|AIza|ya29\\.|ghp_|github_pat_|xoxb-|AKIA|ASIA|eyJ|[a-zA-Z0-9_=:\"&?. -]{1,12}){1,6}"
        ) {
            for (i, p) in PATTERNS.iter().enumerate() {
                let Some((re, _)) = &SECRETS[i] else { continue };
                if p.group == Group::Named && re.is_match(&text) {
                    let lower = text.to_ascii_lowercase();
                    proptest::prop_assert!(
                        p.anchors.iter().any(|a| lower.contains(&a.to_ascii_lowercase())),
                        "{} matches {text:?} without an anchor", p.regex
                    );
                    proptest::prop_assert!(candidates(&text) & 1 << i != 0);
                }
            }
        }
    }

    #[test]
    fn masked_text_is_masked_once_and_for_all() {
        let m = Masked::from("run with sk-proj-Q2x7VbN4kL9mT1rZ8wY3".to_string());
        assert_eq!(m, "run with [redacted]");
        assert_eq!(Masked::from(m.as_str()), m, "masking again changes nothing");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            "\"run with [redacted]\""
        );
    }

    #[test]
    fn json_is_masked_string_by_string_and_stays_json() {
        let value = serde_json::json!({
            "command": "curl -H 'Authorization: Bearer abc.def-123' x",
            "out": ["-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "ok \"quoted\""],
            "sk-proj-Q2x7VbN4kL9mT1rZ8wY3": 1,
        });
        let masked = Masked::json(&value);
        let back: serde_json::Value = serde_json::from_str(&masked).unwrap();
        assert_eq!(back["command"], redact(value["command"].as_str().unwrap()));
        assert!(!masked.contains("abc.def-123"));
        assert_eq!(back["out"][0], "-----BEGIN RSA PRIVATE KEY-----[redacted]");
        assert_eq!(back["out"][1], "ok \"quoted\"");
        assert_eq!(back["[redacted]"], 1);
        assert!(!masked.contains("Q2x7VbN4") && !masked.contains("MIIEow"));
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
