//! Finding the top-level fields and message slices of a request body without parsing
//! what is inside them.
//!
//! serde_json validates every byte of a value it skips, about 1 GB/s; a long history is
//! mostly string bytes, which this scanner jumps over eight at a time to the next quote
//! or backslash. It checks structure only (balanced brackets, closed strings); each message
//! is fully parsed later, once, when `parse_message` reads it (and the caller caches
//! that), and the top-level fields we read are parsed with serde.

/// Why a body is not the JSON object we expected.
#[derive(Debug)]
pub(crate) struct ScanError(pub &'static str);

type Scan<T> = Result<T, ScanError>;

/// Where the JSON value starting at `pos` (its first byte) ends, exclusive. For an
/// array, the spans of its elements are pushed on `elements` when given.
fn value_end(s: &[u8], pos: usize, elements: Option<&mut Vec<(usize, usize)>>) -> Scan<usize> {
    match s.get(pos) {
        Some(b'"') => string_end(s, pos),
        Some(b'{' | b'[') => container_end(s, pos, elements),
        Some(_) => {
            // number, true, false, null: up to the next delimiter
            let len = s[pos..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                .unwrap_or(s.len() - pos);
            if len == 0 {
                return Err(ScanError("expected a value"));
            }
            Ok(pos + len)
        }
        None => Err(ScanError("unexpected end")),
    }
}

/// End of the string starting at `pos` (its opening quote), exclusive.
#[inline]
fn string_end(s: &[u8], pos: usize) -> Scan<usize> {
    let mut i = pos + 1;
    loop {
        // Strings in a history are long and full of escapes (`\n` on every line of every
        // file and output): sixteen bytes per step to the next quote or backslash, and an
        // escape goes straight back to that (most of reading a request is this loop).
        i = skip_plain16(s, i);
        match s.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => {
                i += 2;
                continue;
            }
            _ => {}
        }
        // The last few bytes (or no SSE2): eight at a time while none is a quote or a
        // backslash (memchr2 per stretch between two escapes is slower here).
        while let Some(chunk) = s.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([b'"'; 8]));
            let special = has_byte(word, b'"') | has_byte(word, b'\\');
            if special != 0 {
                // Straight to the first quote or backslash (the lowest flagged byte is
                // exact), not byte by byte through the word: escapes come every few dozen
                // bytes in a history, so this is most of the scan.
                i += (special.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        match s.get(i) {
            Some(b'"') => return Ok(i + 1),
            Some(b'\\') => i += 2,
            Some(_) => i += 1,
            None => return Err(ScanError("unterminated string")),
        }
    }
}

/// The first position at or after `i` that may hold a quote or a backslash, sixteen bytes
/// per step (SSE2, part of every x86_64 CPU); the word loop after it finishes the last
/// few bytes. Elsewhere a no-op.
#[inline]
fn skip_plain16(s: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        // SAFETY: SSE2 is in the x86_64 baseline, and every load reads s[i..i + 16],
        // which the loop condition keeps inside `s`.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            while i + 16 <= s.len() {
                let v = _mm_loadu_si128(s.as_ptr().add(i).cast::<__m128i>());
                let hits = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
                let mask = _mm_movemask_epi8(hits) as u32;
                if mask != 0 {
                    return i + mask.trailing_zeros() as usize;
                }
                i += 16;
            }
        }
    }
    i
}

/// Non-zero when one of the eight bytes of `word` is `byte` (the classic SWAR test).
#[inline]
fn has_byte(word: u64, byte: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let x = word ^ (ONES * byte as u64);
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// End of the object or array starting at `pos`, exclusive. When `elements` is given
/// and the value is an array, the span of each of its elements is pushed on it.
fn container_end(
    s: &[u8],
    pos: usize,
    mut elements: Option<&mut Vec<(usize, usize)>>,
) -> Scan<usize> {
    let mut stack: Vec<u8> = Vec::with_capacity(32);
    let mut element_start = 0;
    let mut i = pos;
    while i < s.len() {
        match s[i] {
            b'"' => {
                i = string_end(s, i)?;
                continue;
            }
            open @ (b'{' | b'[') => {
                stack.push(open);
                if stack.len() == 1 {
                    element_start = skip_ws(s, i + 1);
                }
            }
            close @ (b'}' | b']') => {
                let expected = if close == b'}' { b'{' } else { b'[' };
                if stack.len() == 1 && close == b']' {
                    if let Some(out) = elements.as_deref_mut() {
                        if element_start < i || !out.is_empty() {
                            out.push(element_span(s, element_start, i)?);
                        }
                    }
                }
                if stack.pop() != Some(expected) {
                    return Err(ScanError("mismatched bracket"));
                }
                if stack.is_empty() {
                    return Ok(i + 1);
                }
            }
            b',' if stack.len() == 1 && stack[0] == b'[' => {
                if let Some(out) = elements.as_deref_mut() {
                    out.push(element_span(s, element_start, i)?);
                }
                element_start = skip_ws(s, i + 1);
            }
            _ => {}
        }
        i += 1;
    }
    Err(ScanError("unterminated object or array"))
}

/// The span of an array element that runs from `start` to a separator at `end`.
fn element_span(s: &[u8], start: usize, end: usize) -> Scan<(usize, usize)> {
    let mut e = end;
    while e > start && matches!(s[e - 1], b' ' | b'\n' | b'\r' | b'\t') {
        e -= 1;
    }
    if e == start {
        return Err(ScanError("empty array element"));
    }
    Ok((start, e))
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while matches!(s.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// A top-level member: its raw value, and for an array its elements (found in the same
/// pass, so the history is scanned once).
struct Member<'a> {
    key: &'a [u8],
    value: &'a str,
    elements: Option<Vec<&'a str>>,
}

/// The top-level members of a JSON object body, as raw slices of it.
pub(crate) struct Object<'a> {
    members: Vec<Member<'a>>,
}

impl<'a> Object<'a> {
    pub fn parse(body: &'a str) -> Scan<Object<'a>> {
        let s = body.as_bytes();
        let mut i = skip_ws(s, 0);
        if s.get(i) != Some(&b'{') {
            return Err(ScanError("expected a JSON object"));
        }
        let mut members = Vec::new();
        i = skip_ws(s, i + 1);
        if s.get(i) != Some(&b'}') {
            let mut spans = Vec::new();
            loop {
                if s.get(i) != Some(&b'"') {
                    return Err(ScanError("expected a key"));
                }
                let key_end = string_end(s, i)?;
                let key = &s[i + 1..key_end - 1];
                i = skip_ws(s, key_end);
                if s.get(i) != Some(&b':') {
                    return Err(ScanError("expected ':'"));
                }
                i = skip_ws(s, i + 1);
                spans.clear();
                let end = value_end(s, i, Some(&mut spans))?;
                // All bounds are at ASCII structural bytes: slicing cannot fail.
                let value = body.get(i..end).unwrap_or_default();
                let elements = (s[i] == b'[')
                    .then(|| spans.iter().filter_map(|&(a, b)| body.get(a..b)).collect());
                members.push(Member {
                    key,
                    value,
                    elements,
                });
                i = skip_ws(s, end);
                match s.get(i) {
                    Some(b',') => i = skip_ws(s, i + 1),
                    Some(b'}') => break,
                    _ => return Err(ScanError("expected ',' or '}'")),
                }
            }
        }
        if skip_ws(s, i + 1) != s.len() {
            return Err(ScanError("trailing bytes after the object"));
        }
        Ok(Object { members })
    }

    fn member(&self, key: &str) -> Option<&Member<'a>> {
        // the last one, if the key repeats
        self.members.iter().rev().find(|m| m.key == key.as_bytes())
    }

    /// The raw value of a member.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.member(key).map(|m| m.value)
    }

    /// The raw elements of a member that is an array; `None` if absent or not an array.
    pub fn elements(&self, key: &str) -> Option<&[&'a str]> {
        self.member(key).and_then(|m| m.elements.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    #[test]
    fn finds_the_same_slices_as_serde() {
        let body = r#" {"model":"m\"x","n":-1.5e3,"t":true,"messages":[ {"a":"}]\\"} ,[1,[2]],"s",null ],"e":{}} "#;
        let obj = Object::parse(body).unwrap();
        assert_eq!(obj.get("model"), Some(r#""m\"x""#));
        assert_eq!(obj.get("n"), Some("-1.5e3"));
        assert_eq!(obj.get("e"), Some("{}"));
        let elements = obj.elements("messages").unwrap();
        let serde: Vec<&RawValue> = serde_json::from_str(obj.get("messages").unwrap()).unwrap();
        assert_eq!(elements, serde.iter().map(|r| r.get()).collect::<Vec<_>>());
        assert_eq!(obj.elements("model"), None);
        let empty = Object::parse(r#"{"m": [ ]}"#).unwrap();
        assert_eq!(empty.elements("m").unwrap().len(), 0);
    }

    #[test]
    fn strings_end_at_their_closing_quote_whatever_the_escape_offsets() {
        // Escapes and quotes at every position of the eight-byte words.
        for pad in 0..20 {
            for escape in [r#"\""#, r"\\", r"\n", r"\u0022"] {
                let text = format!("{}{escape}{}", "a".repeat(pad), "b".repeat(pad % 9));
                let body = format!(r#"{{"k":"{text}","m":["{text}","x{escape}"]}}"#);
                let obj = Object::parse(&body).unwrap();
                assert_eq!(
                    obj.get("k"),
                    Some(format!(r#""{text}""#).as_str()),
                    "{body}"
                );
                let serde: Vec<&RawValue> = serde_json::from_str(obj.get("m").unwrap()).unwrap();
                let ours = obj.elements("m").unwrap();
                assert_eq!(ours, serde.iter().map(|r| r.get()).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn rejects_broken_structure() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"a":1"#,
            r#"{"a":"x}"#,
            r#"{"a":[1}"#,
            r#"{"a" 1}"#,
            r#"{"a":1}x"#,
            r#"{a:1}"#,
            r#"{"a":}"#,
        ] {
            assert!(Object::parse(bad).is_err(), "{bad}");
        }
    }
}
