//! Tool results as detection compares them: volatile parts masked, scaffold trailers
//! removed, and the exit status read from wherever the client put it.
//!
//! Two results that differ only in a chunk id, a wall time, a process group, a temp path
//! or SWE-agent's ever-growing `bash: line N:` are the same outcome; comparing them raw
//! would make every repeat look like new information.

use std::sync::LazyLock;

use regex::Regex;

use crate::transcript::ToolResult;

/// What a tool result says about how its call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The exit code when the result states one (shell tools).
    pub exit_code: Option<i32>,
    /// The call failed: a flag from the wire, a non-zero exit code, or an error text.
    pub is_error: bool,
}

/// A normalized result: its masked text (for summaries and similarity) and a hash of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedResult {
    pub text: String,
    pub hash: u64,
    pub outcome: Outcome,
}

/// The first 8 bytes of a blake3 hash: compact keys for the detection state. Collisions at
/// 64 bits are irrelevant at the scale of one conversation.
pub fn hash64(bytes: &[u8]) -> u64 {
    let h = blake3::hash(bytes);
    let b = h.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// A regex of the code's own (a literal): a bad one is a programming error that the unit
/// tests reach, never input.
#[allow(clippy::panic, reason = "a literal pattern, checked by every test run")]
pub(crate) fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("bad built-in regex {pattern}: {e}"))
}

/// Exit codes as clients print them, in the head or trailer of a result.
static EXIT_CODE: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    vec![
        re(r"<returncode>\s*(-?\d+)\s*</returncode>"),
        re(r#""returncode"\s*:\s*(-?\d+)"#),
        re(r"\[Command finished with exit code (-?\d+)\]"),
        re(r"\[The command completed with exit code (-?\d+)"),
        re(r"Process exited with code (-?\d+)"),
        re(r"(?m)^Exit [Cc]ode:? (-?\d+)"),
        re(r"\[Command finished with exit code (-?\d+)"),
    ]
});

/// Texts that mean the call failed when no exit code says otherwise. Kept to phrases that
/// tools print about the call itself (not program output that may quote an error).
static ERROR_TEXT: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"(?i)^\s*(error:|error\b|<tool_use_error>|usage:|traceback \(most recent call last\))",
        r"|command not found|no such file or directory|did not appear verbatim",
        r"|no replacement was performed|your proposed edit has introduced new syntax error",
        r"|apply_patch verification failed|could not find (an exact match|oldstring)",
        r"|^file not found|^file .* not found|syntax error near unexpected token",
        r"|unexpected eof while looking for matching|string to replace not found",
        r"|^invalid `?\w+`? parameter",
        // The scaffold killed a command that ran too long (SWE-agent, OpenHands).
        r"|^\s*(execution|command) timed out\b",
    ))
});

/// A failing verdict of a test runner or an uncaught exception, anywhere in a result: pytest's
/// `FAILED x::t` lines and `1 failed` summary, unittest's `FAILED (failures=1)`, a Python
/// traceback. Read only when the result states no exit code of its own.
static FAILED_VERDICT: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"(?m)^(FAILED\b|ERROR \S+::|Traceback \(most recent call last\):$)",
        r"|^=+ .*\b\d+ (failed|errors?)\b.* =+$",
    ))
});

/// Scaffold lines that carry no outcome of their own (their exit code is read first).
static TRAILER_LINES: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"(?m)^\[(The command completed with exit code|Command finished with exit code",
        r"|Current working directory:|Python interpreter:)[^\n]*\]?$",
        r"|^\(Open file: [^\n]*\)$|^\(Current directory: [^\n]*\)$|^bash-\$\s*$",
        r"|^Chunk ID: [^\n]*$|^Wall time: [^\n]*$|^Original token count: [^\n]*$",
        r"|^Process Group PGID: [^\n]*$|^Process exited with code -?\d+$",
        r"|^Exit [Cc]ode:? -?\d+$|^</?untrusted_context>$|^</?returncode>[^\n]*$",
        r"|^</?output>$",
    ))
});

/// Volatile fragments and their masks, applied in order.
static MASKS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    vec![
        // SWE-agent's shell counts lines over the whole session.
        (re(r"bash: line \d+:"), "bash: line N:"),
        (
            re(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?"),
            "<time>",
        ),
        (re(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "<time>"),
        (
            re(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
            "<uuid>",
        ),
        (re(r"0x[0-9a-fA-F]+"), "0x<addr>"),
        (
            re(
                r"(?i)\b\d+(\.\d+)?\s?(ms|msec|milliseconds|s|sec|secs|seconds|µs|us|ns|m|min|minutes)\b",
            ),
            "<dur>",
        ),
        (re(r"(?i)\b(pid|process|pgid)[ :=]+\d+"), "$1 <pid>"),
        (
            re(r"(/tmp|/var/tmp|/var/folders)/[A-Za-z0-9_.\-/]+"),
            "$1/<tmp>",
        ),
        (
            re(r"(localhost|127\.0\.0\.1|0\.0\.0\.0):\d{2,5}"),
            "$1:<port>",
        ),
    ]
});

/// Hex-looking words; masked only when they mix letters and digits (see [`mask_hex`]).
static HEX_WORD: LazyLock<Regex> = LazyLock::new(|| re(r"\b[0-9a-fA-F]{7,64}\b"));

/// Reads the exit status and error flag of a result.
pub fn outcome(result: &ToolResult) -> Outcome {
    let exit_code = exit_code(&result.text);
    let flagged = result.is_error == Some(true);
    let is_error = match exit_code {
        Some(code) => code != 0 || flagged,
        // No exit code (opencode's failing shell runs, SWE-agent's shell): the text is all
        // there is, so an error at its head or a test runner's failing verdict anywhere.
        None => {
            flagged
                || ERROR_TEXT.is_match(head(&result.text, 400))
                || FAILED_VERDICT.is_match(&result.text)
        }
    };
    Outcome {
        exit_code,
        is_error,
    }
}

/// The exit code stated in the head or the trailer of a result, if any.
pub fn exit_code(text: &str) -> Option<i32> {
    let head = head(text, 300);
    let tail = tail(text, 400);
    for re in EXIT_CODE.iter() {
        for part in [head, tail] {
            if let Some(c) = re.captures(part) {
                if let Some(code) = c.get(1).and_then(|m| m.as_str().parse::<i32>().ok()) {
                    return Some(code);
                }
            }
        }
    }
    None
}

/// The first `n` bytes of `s`, cut at a char boundary.
fn head(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last `n` bytes of `s`, cut at a char boundary.
fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Masks volatile parts and scaffold trailers of a result text.
pub fn normalize_text(text: &str) -> String {
    let mut s = unwrap_json_result(text).unwrap_or_else(|| text.to_string());
    s = TRAILER_LINES.replace_all(&s, "").into_owned();
    for (re, rep) in MASKS.iter() {
        if re.is_match(&s) {
            s = re.replace_all(&s, *rep).into_owned();
        }
    }
    s = mask_hex(&s);
    // Whitespace at line ends and blank-line runs are formatting, not outcome.
    let mut out = String::with_capacity(s.len());
    let mut blank_run = 0;
    for line in s.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string()
}

/// mini-swe-agent's tool result is JSON text `{"returncode": 1, "output": "..."}`: compare
/// its output (the code is read by [`exit_code`] from the raw text).
fn unwrap_json_result(text: &str) -> Option<String> {
    let t = text.trim_start();
    if !t.starts_with('{') || !t.contains("\"returncode\"") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(t).ok()?;
    let out = v.get("output")?.as_str()?;
    Some(out.to_string())
}

/// Masks hex words that mix letters and digits (commit ids, chunk ids, object ids).
/// All-digit words are numbers in program output and stay; all-letter words are words.
fn mask_hex(s: &str) -> String {
    if !HEX_WORD.is_match(s) {
        return s.to_string();
    }
    HEX_WORD
        .replace_all(s, |c: &regex::Captures<'_>| {
            let w = &c[0];
            let digits = w.bytes().any(|b| b.is_ascii_digit());
            let letters = w.bytes().any(|b| b.is_ascii_alphabetic());
            if digits && letters {
                "<hex>".to_string()
            } else {
                w.to_string()
            }
        })
        .into_owned()
}

/// Lines that state an error or a test verdict.
static VERDICT_LINE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)(error|exception|failed|failure|assert|traceback|panicked|fatal)"));

/// The outcome signature of a normalized result: what failed, not the debug output around
/// it. Two runs of a check that end in the same error lines have the same signature even
/// when the prints before them differ; a result with no error line is its whole text.
pub fn outcome_signature(normalized: &str) -> u64 {
    let lines: Vec<&str> = normalized
        .lines()
        .filter(|l| VERDICT_LINE.is_match(l))
        .collect();
    if lines.is_empty() {
        return hash64(normalized.as_bytes());
    }
    let tail = &lines[lines.len().saturating_sub(3)..];
    hash64(tail.join("\n").as_bytes())
}

/// Words that report a failure in program output ("0 failed" and "no errors" do not).
static FAILURE_WORD: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)\b(error|exception|traceback|failed|failure|fail|assertionerror|panicked|fatal|not found|cannot|can't|unable)\b",
    )
});
static NOT_FAILURE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\b(0|no) (errors?|failures?|failed)\b"));

/// Whether a result's text reports a failure even though its exit code may be 0 (a repro
/// script printing "Test failed: ...", a test runner's summary).
pub fn shows_failure(normalized: &str) -> bool {
    normalized.lines().any(is_failure_line)
}

/// Whether one line of a result reports a failure.
pub fn is_failure_line(line: &str) -> bool {
    FAILURE_WORD.is_match(line) && !NOT_FAILURE.is_match(line)
}

/// The one line of a normalized result a human should see in a summary: the first line that
/// reports a failure, else the first line with content. Scaffold labels such as Codex's
/// `Output:` header carry nothing and are skipped.
pub fn headline(normalized: &str) -> &str {
    let is_label = |l: &str| l.ends_with(':') && l.len() < 24 && !l.contains(' ');
    let mut lines = normalized
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_label(l));
    let first = lines.clone().next().unwrap_or("");
    lines.find(|l| is_failure_line(l)).unwrap_or(first)
}

/// Normalizes a result: masked text, its hash and its outcome.
pub fn normalize(result: &ToolResult) -> NormalizedResult {
    let text = normalize_text(&result.text);
    let hash = hash64(text.as_bytes());
    NormalizedResult {
        hash,
        text,
        outcome: outcome(result),
    }
}

/// Lines of one result read for novelty at most: a longer result's first lines are
/// enough to say whether it shows anything new, and the set of seen lines stays bounded
/// by what the conversation's requests carry.
pub const CONTENT_LINES_MAX: usize = 2000;

/// The content lines of a normalized result, hashed, as a reader compares them with what
/// the run has already printed: a line-number decoration dropped (`cat -n`, `nl`, `grep -n`,
/// `path:12:`, an editor's `12→`/`12\t`, SWE-agent's `12:`), surrounding space trimmed,
/// and lines with fewer than three letters or digits (braces, blank lines, rulers) left
/// out. The same window of a file printed by `cat`, `sed -n`, `head`, `grep` or a viewer
/// gives the same lines, whatever the command.
pub fn content_lines(normalized: &str) -> impl Iterator<Item = u64> + '_ {
    normalized
        .lines()
        .take(CONTENT_LINES_MAX)
        .map(|l| strip_line_number(l).trim())
        .filter(|l| l.chars().filter(|c| c.is_alphanumeric()).take(3).count() == 3)
        .map(|l| hash64(l.as_bytes()))
}

/// A line without the line number a reader or a search put before it: `  12\tx`, `12:x`,
/// `12-x` (grep's context), `12→x`, `12|x`, `path:12:x`; the line as it is otherwise.
fn strip_line_number(line: &str) -> &str {
    let t = line.trim_start();
    // `path:12:x` (grep -rn): a path-like word, a colon, then the number.
    let t = match t.split_once(':') {
        Some((path, rest))
            if !path.is_empty()
                && !path.contains(char::is_whitespace)
                && (path.contains('/') || path.contains('.'))
                && rest.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            rest
        }
        _ => t,
    };
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return line;
    }
    let rest = &t[digits..];
    for sep in [":", "\t", "→", "|", "-"] {
        if let Some(r) = rest.strip_prefix(sep) {
            return r;
        }
    }
    if rest.is_empty() {
        return rest;
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_headline_is_the_failure_not_a_scaffold_label() {
        let codex = "Process exited with code 1\nOutput:\nrunning 1 test\nFAILED test_calc.py::test_add - AssertionError\n";
        assert_eq!(
            super::headline(codex),
            "FAILED test_calc.py::test_add - AssertionError"
        );
        assert_eq!(super::headline("Output:\nhello\n"), "hello");
        assert_eq!(super::headline("\n\n"), "");
    }

    use super::*;

    fn res(text: &str, is_error: Option<bool>) -> ToolResult {
        ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: text.into(),
            is_error,
        }
    }

    #[test]
    fn a_window_of_a_file_gives_the_same_content_lines_whatever_printed_it() {
        let lines = |t: &str| content_lines(t).collect::<Vec<_>>();
        let cat = "def add(a, b):\n    return a + b\n}\n";
        let want = lines(cat);
        assert_eq!(want.len(), 2, "a brace is no content line");
        for printed in [
            "     1\tdef add(a, b):\n     2\t    return a + b\n",
            "1:def add(a, b):\n2:    return a + b",
            "src/calc.py:1:def add(a, b):\nsrc/calc.py:2:    return a + b",
            "     1→def add(a, b):\n     2→    return a + b",
            "12-def add(a, b):\n13:    return a + b",
        ] {
            assert_eq!(lines(printed), want, "{printed}");
        }
        // A count is content, not a line number.
        assert_ne!(lines("3 passed"), lines("4 passed"));
        assert_ne!(lines("1:def sub(a, b):"), want[..1]);
    }

    #[test]
    fn exit_codes_from_every_client() {
        assert_eq!(exit_code("Exit code 1\nboom"), Some(1));
        assert_eq!(
            exit_code("Chunk ID: 879c6b\nWall time: 0.0000 seconds\nProcess exited with code 1\nOutput:\nx"),
            Some(1)
        );
        assert_eq!(
            exit_code("<untrusted_context>\nOutput: x\nExit Code: 2\nProcess Group PGID: 6159\n</untrusted_context>"),
            Some(2)
        );
        assert_eq!(
            exit_code(r#"{"returncode": 1, "output": "FAILED"}"#),
            Some(1)
        );
        assert_eq!(
            exit_code("<returncode>0</returncode>\n<output>\nok\n</output>"),
            Some(0)
        );
        assert_eq!(
            exit_code("boom\n[The command completed with exit code 2.]\n[Current working directory: /w]\n[Command finished with exit code 2]"),
            Some(2)
        );
        assert_eq!(exit_code("all good"), None);
    }

    #[test]
    fn outcome_prefers_codes_then_flags_then_text() {
        assert!(outcome(&res("Exit code 1\nx", Some(true))).is_error);
        assert!(
            !outcome(&res(
                "<returncode>0</returncode><output>Error: none</output>",
                None
            ))
            .is_error
        );
        assert!(outcome(&res("ERROR:\nInvalid `path` parameter", None)).is_error);
        assert!(outcome(&res("/bin/bash: line 3: javac: command not found", None)).is_error);
        assert!(!outcome(&res("File created successfully at: /w/x.py", None)).is_error);
        assert!(outcome(&res("File not found: /a", None)).is_error);
        // No exit code (opencode): a test runner's failing verdict anywhere in the text.
        let pytest = "collected 1 item\n\ntest_x.py F\n\nFAILED test_x.py::t - assert 1 == 2\n=== 1 failed in 0.02s ===";
        assert!(outcome(&res(pytest, None)).is_error);
        assert!(!outcome(&res("collected 1 item\n\n=== 1 passed in 0.02s ===", None)).is_error);
        // An exit code of 0 wins over a verdict-looking line.
        assert!(!outcome(&res("Exit code 0\nFAILED (expected)", None)).is_error);
    }

    #[test]
    fn volatile_parts_are_masked() {
        let a = "Chunk ID: 879c6b\nWall time: 0.0132 seconds\nProcess exited with code 1\nOutput:\nFAILED test_x - AssertionError at 0x7f3a2b1c\n";
        let b = "Chunk ID: a1b2c3\nWall time: 1.5 seconds\nProcess exited with code 1\nOutput:\nFAILED test_x - AssertionError at 0x7f00ffee\n";
        assert_eq!(normalize_text(a), normalize_text(b));
        let g1 = "<untrusted_context>\nOutput: boom\nExit Code: 1\nProcess Group PGID: 6159\n</untrusted_context>";
        let g2 = "<untrusted_context>\nOutput: boom\nExit Code: 1\nProcess Group PGID: 7000\n</untrusted_context>";
        assert_eq!(normalize_text(g1), normalize_text(g2));
        let s1 = "/bin/bash: line 17019: After: command not found\n(Open file: n/a)\n(Current directory: /r)\nbash-$";
        let s2 = "/bin/bash: line 17044: After: command not found\n(Open file: /r/x.java)\n(Current directory: /r)\nbash-$";
        assert_eq!(normalize_text(s1), normalize_text(s2));
        assert_eq!(
            normalize_text("Ran 3 tests in 0.002s\nat 2025-06-01T10:00:01Z in /tmp/tmpab12cd/x.py"),
            normalize_text("Ran 3 tests in 0.910s\nat 2026-01-02T11:22:33Z in /tmp/tmpzz99/x.py")
        );
        assert_eq!(
            normalize_text("commit 3f9a1c2d0b"),
            normalize_text("commit 77aa0c1e2f")
        );
    }

    #[test]
    fn plain_numbers_and_words_survive() {
        // All-digit "hex" words are program output; all-letter ones are words.
        assert_ne!(
            normalize_text("expected 1234567 got"),
            normalize_text("expected 7654321 got")
        );
        assert_ne!(
            normalize_text("value deadbeefcafe"),
            normalize_text("value facadebeaded")
        );
        assert_ne!(
            normalize_text("AssertionError: 3 != 4"),
            normalize_text("AssertionError: 3 != 5")
        );
    }

    #[test]
    fn mini_swe_agent_json_result_compares_its_output() {
        let a = normalize(&res(r#"{"returncode": 1, "output": "FAILED: x\n"}"#, None));
        let b = normalize(&res(
            "<returncode>1</returncode>\n<output>\nFAILED: x\n</output>",
            None,
        ));
        assert_eq!(a.hash, b.hash);
        assert_eq!(a.outcome.exit_code, Some(1));
        assert!(a.outcome.is_error);
    }
}
