//! Shell-style wildcard patterns for names a user writes in the config: model names
//! (`claude-sonnet-4*`), teams, clients. `*` matches any run of characters (none too), `?`
//! exactly one; everything else matches itself, case-sensitively. No character classes:
//! model ids use `[`/`]` nowhere, and a pattern a reader must decode is a pattern misread.

/// Whether `text` matches `pattern` as a whole.
pub fn matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // The classic greedy walk with one backtrack point (the last `*`): linear in practice,
    // and never worse than pattern × text, so a hostile model name costs no more than that.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn stars_and_question_marks_match_as_in_a_shell() {
        assert!(matches("claude-sonnet-4*", "claude-sonnet-4-5-20250929"));
        assert!(matches("*", ""));
        assert!(matches("gpt-?o", "gpt-4o"));
        assert!(matches("*mini*", "gpt-4.1-mini-2025-04-14"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(
            !matches("gpt-4o", "gpt-4o-mini"),
            "whole text, not a prefix"
        );
        assert!(!matches("gpt-?o", "gpt-o"));
        assert!(!matches("claude*", "Claude-3"), "case-sensitive");
        assert!(!matches("a*b", "aXbY"));
        assert!(matches("", ""));
        assert!(!matches("", "x"));
    }
}
