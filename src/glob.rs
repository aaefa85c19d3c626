//! Shell-style wildcard patterns for names a user writes in the config: model names
//! (`claude-sonnet-4*`), teams, clients. `*` matches any run of characters (none too), `?`
//! exactly one; everything else matches itself, case-sensitively ([`matches`]) or with
//! ASCII letters in either case ([`matches_any_case`], for teams). No character classes:
//! model ids use `[`/`]` nowhere, and a pattern a reader must decode is a pattern misread.

/// Whether `text` matches `pattern` as a whole.
///
/// Walks the UTF-8 bytes (every request's policy is chosen with these, so nothing is
/// allocated): `*` and `?` are ASCII and so never part of another character's encoding, a
/// literal character matches exactly when its bytes do, and `?` steps over one whole
/// character. The greedy walk keeps one backtrack point (the last `*`): never worse than
/// pattern × text, so a hostile model name costs no more than that.
pub fn matches(pattern: &str, text: &str) -> bool {
    walk(pattern, text, |a, b| a == b)
}

/// [`matches`], an ASCII letter matching itself in either case (`CI` is `ci`).
pub fn matches_any_case(pattern: &str, text: &str) -> bool {
    walk(pattern, text, |a, b| a.eq_ignore_ascii_case(&b))
}

/// The walk of [`matches`], bytes compared by `same`.
fn walk(pattern: &str, text: &str, same: impl Fn(u8, u8) -> bool) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(b'?') => {
                p += 1;
                t += char_len(text[t]);
            }
            Some(&c) if same(c, text[t]) => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    // The star takes one more character and the rest is tried again.
                    let st = st + char_len(text[st]);
                    star = Some((sp, st));
                    p = sp + 1;
                    t = st;
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// Bytes of the UTF-8 character that starts with `first`.
fn char_len(first: u8) -> usize {
    match first {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
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

    #[test]
    fn any_case_matches_ascii_letters_in_either_case() {
        use super::matches_any_case;
        assert!(matches_any_case("CI", "ci"));
        assert!(matches_any_case("team-*", "Team-A"));
        assert!(!matches_any_case("ci", "cid"));
        assert!(!matches("CI", "ci"));
    }

    #[test]
    fn a_question_mark_is_one_character_whatever_its_bytes() {
        assert!(matches("t?am", "téam"));
        assert!(matches("équipe-?", "équipe-ü"));
        assert!(!matches("t?m", "téam"));
        assert!(matches("*é", "caféé"));
        assert!(matches("*?", "é"));
        assert!(!matches("??", "é"));
    }
}
