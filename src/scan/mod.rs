//! Finding the top-level fields and message slices of a request body without parsing
//! what is inside them, from the body's start ([`Object::parse`]) or after an earlier body
//! it repeats most of ([`Object::parse_after`], with what the earlier scan found:
//! [`Scanned`], and the bytes compared while the body arrived: [`SharedPrefix`]). The wire
//! formats (`crate::dialect`) read the members found; which earlier body a request is read
//! after is the proxy's memory of its conversation (`proxy::memory`).
//!
//! serde_json validates every byte of a value it skips, about 1 GB/s; a long history is
//! mostly string bytes, which this scanner jumps over eight at a time to the next quote
//! or backslash. It checks structure only (balanced brackets, closed strings); each message
//! is fully parsed later, once, when `parse_message` reads it (and the caller caches
//! that), and the top-level fields we read are parsed with serde.
#![allow(
    unsafe_code,
    reason = "SIMD loads, and str views of bytes already checked as UTF-8: each block says why it holds"
)]

use bytes::Bytes;

use crate::request_bytes::RequestBytes;

/// `bytes` as text, if they are valid UTF-8: the one check every body and streamed event
/// goes through. `simdutf8` checks 16 or 32 bytes at a time whatever they hold; std reads
/// ASCII a word at a time but other text a byte at a time. Measured on a 0.9 MB
/// conversation in Chinese sent as raw UTF-8 (as Node clients send it): 716 µs with std,
/// 59 µs; on the bench's 2 MB body: 100 and 54 µs (BENCHMARKS.md, "What was tried"). The
/// error, rare, comes from std's check, for its position.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    simdutf8::basic::from_utf8(bytes).or_else(|_| std::str::from_utf8(bytes))
}

/// Why a body is not the JSON object we expected.
#[derive(Debug)]
pub struct ScanError(pub &'static str);

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
fn container_end(s: &[u8], pos: usize, elements: Option<&mut Vec<(usize, usize)>>) -> Scan<usize> {
    let walk = Walk {
        stack: Vec::with_capacity(32),
        element_start: 0,
        i: pos,
    };
    walk.run(s, elements, usize::MAX)
}

/// Where a scan through an object or array stands: the open brackets, where the current
/// element of the outermost one began, and the next byte to read. The scan reads left to
/// right and never looks back past `i`, so this is all it knows at `i`: a body that shares
/// the first `i` bytes with one already scanned can be scanned on from there.
struct Walk {
    stack: Vec<u8>,
    element_start: usize,
    i: usize,
}

impl Walk {
    /// Scans on to the end of the outermost container, exclusive, or until `limit`
    /// elements are on `elements` (then the position reached).
    fn run(
        self,
        s: &[u8],
        mut elements: Option<&mut Vec<(usize, usize)>>,
        limit: usize,
    ) -> Scan<usize> {
        let Walk {
            mut stack,
            mut element_start,
            mut i,
        } = self;
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
                                if out.len() >= limit {
                                    return Ok(i);
                                }
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
                        if out.len() >= limit {
                            return Ok(i);
                        }
                    }
                    element_start = skip_ws(s, i + 1);
                }
                _ => {}
            }
            i += 1;
        }
        Err(ScanError("unterminated object or array"))
    }
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

/// The last of `old`'s array `elements` that `body` holds byte for byte in the same place,
/// and where it ends: `(k, shared)`. `known`: how many of `body`'s first bytes are already
/// known to be `old`'s. Sixteen elements per comparison while all match, then one by one
/// through the group that does not (few calls, and each byte compared about once).
fn last_shared_element(
    body: &RequestBytes,
    old: &RequestBytes,
    elements: &[(usize, usize)],
    known: usize,
) -> Option<(usize, usize)> {
    let same = |from: usize, to: usize| {
        let from = from.max(known).min(to);
        body.range_eq(from..to, old, from..to)
    };
    let mut shared = 0;
    let mut last = None;
    for group in elements.chunks(16) {
        let end = group[group.len() - 1].1;
        if same(shared, end) {
            shared = end;
            last = Some(last.map_or(0, |k| k + 1) + group.len() - 1);
            continue;
        }
        for &(_, end) in group {
            if !same(shared, end) {
                break;
            }
            shared = end;
            last = Some(last.map_or(0, |k| k + 1));
        }
        break;
    }
    Some((last?, shared))
}

/// The spans of the first `n` elements of the array member `key` of a body (the first
/// member so named; a member that is not an array is one element), scanning no further:
/// enough to recognise a conversation by its first messages without reading its history.
/// Structure past them is not checked; a body that is not an object gives none. The
/// request path takes [`first_elements_guessed`]; this exact walk is what its tests hold
/// the guess to.
#[cfg(test)]
fn first_elements(s: &[u8], key: &str, n: usize) -> Vec<(usize, usize)> {
    first_elements_walked(s, key, n, false)
}

/// The first elements (as `first_elements` walks to them), found without walking the
/// containers before the member: some clients put large members first (Anthropic's
/// `system` and `tools`, 4 KB of the bench's 8.8 KB request), and walking them cost
/// more than the rest of reading the request's top level (20.7 k instructions). Members
/// are walked while they are scalars (`model`, `max_tokens`: cheap); at the first
/// object or array that is not the member, the rest is searched instead for the first
/// `"key"` that reads as a member name with an array value (after `{` or `,`, then `:`
/// and `[`). A nested member of that name and shape is taken if it comes first, so this
/// is a guess, and the caller must allow for it: the conversation key only finds an
/// earlier request to compare with, so a wrong guess costs speed, never a wrong
/// reading. When the search finds no such array, the walk goes on exactly from that
/// container.
pub(crate) fn first_elements_guessed(s: &[u8], key: &str, n: usize) -> Vec<(usize, usize)> {
    first_elements_walked(s, key, n, true)
}

fn first_elements_walked(s: &[u8], key: &str, n: usize, mut guess: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return out;
    }
    i = skip_ws(s, i + 1);
    while s.get(i) == Some(&b'"') {
        let Ok(key_end) = string_end(s, i) else {
            break;
        };
        let found = s.get(i + 1..key_end - 1) == Some(key.as_bytes());
        i = skip_ws(s, key_end);
        if s.get(i) != Some(&b':') {
            break;
        }
        i = skip_ws(s, i + 1);
        if found && s.get(i) == Some(&b'[') {
            elements_from(s, i, n, &mut out);
            break;
        }
        if guess && !found && matches!(s.get(i), Some(b'[' | b'{')) {
            if let Some(open) = array_member_after(s, i, key) {
                elements_from(s, open, n, &mut out);
                break;
            }
            // No such array anywhere after: walk on exactly from this member.
            guess = false;
        }
        let Ok(end) = value_end(s, i, None) else {
            break;
        };
        if found {
            out.push((i, end));
            break;
        }
        i = skip_ws(s, end);
        if s.get(i) != Some(&b',') {
            break;
        }
        i = skip_ws(s, i + 1);
    }
    out.truncate(n);
    out
}

/// Pushes the spans of the first `n` elements of the array opening at `open` (fewer when
/// the body ends first).
fn elements_from(s: &[u8], open: usize, n: usize, out: &mut Vec<(usize, usize)>) {
    let walk = Walk {
        stack: Vec::with_capacity(32),
        element_start: 0,
        i: open,
    };
    // An error past the first elements is the full parse's to report.
    let _ = walk.run(s, Some(out), n);
}

/// Where the array value opens of the first `"key"` at or after `from` that reads as a
/// member name with an array value (see [`first_elements_guessed`]).
fn array_member_after(s: &[u8], from: usize, key: &str) -> Option<usize> {
    let rest = s.get(from..)?;
    memchr::memmem::find_iter(rest, key.as_bytes()).find_map(|at| {
        let at = from + at;
        // The name's quotes, a `{` or `,` before it and a `:` then `[` after it.
        let (open_quote, close_quote) = (at.checked_sub(1)?, at + key.len());
        if s.get(open_quote) != Some(&b'"') || s.get(close_quote) != Some(&b'"') {
            return None;
        }
        let before = s[..open_quote]
            .iter()
            .rev()
            .find(|b| !b.is_ascii_whitespace());
        if !matches!(before, Some(b'{' | b',')) {
            return None;
        }
        let colon = skip_ws(s, close_quote + 1);
        if s.get(colon) != Some(&b':') {
            return None;
        }
        let open = skip_ws(s, colon + 1);
        (s.get(open) == Some(&b'[')).then_some(open)
    })
}

/// A top-level member, as byte spans of the body: its key (without the quotes), its raw
/// value, and for an array its elements (found in the same pass, so the history is
/// scanned once).
#[derive(Clone, Debug, PartialEq)]
struct Member {
    key: (usize, usize),
    value: (usize, usize),
    elements: Option<Vec<(usize, usize)>>,
}

/// A body's text, in one piece or two ([`RequestBytes`]): spans are offsets in the whole
/// body, and a span that straddles the pieces reads as nothing. The pieces meet at the
/// start of a history element, so only the history array itself and the whole object
/// straddle them, and neither is read as one slice.
#[derive(Clone, Copy)]
struct Text<'a> {
    head: &'a str,
    /// Empty when the body is one piece.
    tail: &'a str,
}

impl<'a> Text<'a> {
    fn whole(body: &'a str) -> Text<'a> {
        Text {
            head: body,
            tail: "",
        }
    }

    fn get(self, span: (usize, usize)) -> Option<&'a str> {
        let (piece, a, b) = self.locate(span)?;
        piece.get(a..b)
    }

    /// The piece a span lies in, and the span in that piece; `None` if it straddles both.
    fn locate(self, (a, b): (usize, usize)) -> Option<(&'a str, usize, usize)> {
        let split = self.head.len();
        if b <= split {
            Some((self.head, a, b))
        } else if a >= split {
            Some((self.tail, a - split, b - split))
        } else {
            None
        }
    }

    /// The piece the scan reads on in (the last one), and where it starts in the body.
    fn last_piece(self) -> (&'a str, usize) {
        if self.tail.is_empty() {
            (self.head, 0)
        } else {
            (self.tail, self.head.len())
        }
    }
}

/// The top-level members of a JSON object body, as raw slices of it.
pub struct Object<'a> {
    text: Text<'a>,
    members: Vec<Member>,
    /// How many of the first elements of the resumed array lie where they lay in the body
    /// scanned before, with the same bytes (0 when the scan did not resume).
    unchanged: usize,
}

/// The member `key` names (the last one, if the key repeats), by index.
fn member_index(text: Text<'_>, members: &[Member], key: &str) -> Option<usize> {
    members.iter().rposition(|m| text.get(m.key) == Some(key))
}

/// [`member_index`] in a scanned body.
fn member_index_in(body: &RequestBytes, members: &[Member], key: &str) -> Option<usize> {
    members
        .iter()
        .rposition(|m| body.get(m.key.0..m.key.1) == Some(key.as_bytes()))
}

impl<'a> Object<'a> {
    pub fn parse(body: &'a str) -> Scan<Object<'a>> {
        let s = body.as_bytes();
        let mut i = skip_ws(s, 0);
        if s.get(i) != Some(&b'{') {
            return Err(ScanError("expected a JSON object"));
        }
        i = skip_ws(s, i + 1);
        if s.get(i) == Some(&b'}') {
            return Object::finish(Text::whole(body), Vec::new(), i);
        }
        Object::members_from(Text::whole(body), Vec::new(), i)
    }

    /// `body` parsed exactly as [`Object::parse`] would, reading only what follows the
    /// bytes it shares with `before` (a body parsed earlier): the scan resumes inside the
    /// array member `key` after its last element that both bodies hold byte for byte in
    /// the same place (the bytes up to there, compared, are all that is read of them).
    /// `None` when there is no such element, or when anything past it is not a valid
    /// object (the caller parses from the start then, which reports the error).
    ///
    /// `prefix`, when given, says how many of `body`'s first bytes were already found to
    /// be `before`'s while the body arrived: those are not compared again.
    ///
    /// A body in two pieces is read only if its head is `before`'s first bytes up to the
    /// start of one of the elements both share (as `proxy::forward::body` splits it): the scan
    /// resumes in its tail.
    pub fn parse_after(
        body: &'a RequestBytes,
        key: &str,
        before: &Scanned,
        prefix: Option<&SharedPrefix>,
    ) -> Option<Object<'a>> {
        let old = &before.body;
        let m = member_index_in(old, &before.members, key)?;
        let array = &before.members[m];
        let old_elements = array.elements.as_ref()?;
        let known = prefix.map_or(0, |p| p.known(body, before));
        let (k, shared) = last_shared_element(body, old, old_elements, known)?;
        // The scan goes on in the body's last piece: a body in two pieces must have its
        // tail start at an element up to `k` (all shared, so its head is `old`'s bytes up
        // to there and every element and member lies in one piece).
        let split = body.head().len();
        let whole = body.whole().is_some();
        if !whole
            && old_elements[..=k]
                .binary_search_by_key(&split, |e| e.0)
                .is_err()
        {
            return None;
        }
        let (piece, base) = if whole {
            (body.head().as_ref(), 0)
        } else {
            (body.tail().as_ref(), split)
        };
        // What the scan of `old` knew at `shared`: the elements before element `k`, inside
        // the array's brackets. The array is scanned on from there (bytes only: UTF-8 is
        // checked below).
        let mut elements = Vec::with_capacity(old_elements.len() + 16);
        elements.extend_from_slice(&old_elements[..k]);
        let mut stack = Vec::with_capacity(32);
        stack.push(b'[');
        let walk = Walk {
            stack,
            element_start: old_elements[k].0 - base,
            i: shared - base,
        };
        let end = base + walk.run(piece, Some(&mut elements), usize::MAX).ok()?;
        for span in &mut elements[k..] {
            *span = (span.0 + base, span.1 + base);
        }
        // The members after the array (tools, settings) are the same bytes in most requests
        // of a conversation: when everything after the array is, those members are `old`'s,
        // moved by as much as the array grew, and not scanned again.
        let old_end = array.value.1;
        let same_tail = (end == old_end && known == body.len() && known == old.len())
            || body.range_eq(end..body.len(), old, old_end..old.len());
        // `old` is valid UTF-8 (a `Scanned` holds only bodies that parsed), and `shared`
        // ends an element and `end` the array, both before ASCII bytes: `body[..shared]`
        // (the same bytes as `old`'s) and a tail equal to `old`'s are valid UTF-8 on their
        // own. The rest is checked.
        let unchecked_tail = if same_tail { body.len() - end } else { 0 };
        utf8(piece.get(shared - base..piece.len() - unchecked_tail)?).ok()?;
        // SAFETY: each piece is valid UTF-8. A whole body is the concatenation of the valid
        // sequences above. A body in two pieces was split at an element start of `old`
        // (checked above), an ASCII byte: its head, `old`'s bytes up to there, is valid
        // on its own, and so is its tail, `old`'s bytes from there to `shared` followed
        // by the sequences above.
        let text = unsafe {
            Text {
                head: std::str::from_utf8_unchecked(body.head()),
                tail: std::str::from_utf8_unchecked(body.tail()),
            }
        };
        let mut members = before.members[..m].to_vec();
        members.push(Member {
            key: array.key,
            value: (array.value.0, end),
            elements: Some(elements),
        });
        let mut object = if same_tail {
            let moved = |at: usize| at - old_end + end;
            let span = |(a, b): (usize, usize)| (moved(a), moved(b));
            members.extend(before.members[m + 1..].iter().map(|after| {
                Member {
                    key: span(after.key),
                    value: span(after.value),
                    elements: after
                        .elements
                        .as_ref()
                        .map(|spans| spans.iter().copied().map(span).collect()),
                }
            }));
            Object {
                text,
                members,
                unchanged: 0,
            }
        } else {
            let i = skip_ws(piece, end - base);
            match piece.get(i) {
                Some(b',') => Object::members_from(text, members, base + skip_ws(piece, i + 1)),
                Some(b'}') => Object::finish(text, members, base + i),
                _ => return None,
            }
            .ok()?
        };
        // The elements before `k` are `old`'s (copied above), and so is element `k` if it
        // ends where it did, inside the shared bytes (it may be a number that grew): those
        // are `old`'s byte for byte, when the array is still the one `key` names.
        if member_index(text, &object.members, key) == Some(m) {
            if let Some(new_elements) = &object.members[m].elements {
                object.unchanged = k + usize::from(new_elements.get(k) == Some(&old_elements[k]));
            }
        }
        Some(object)
    }

    /// The members from the key at `i` on to the closing brace, after `members`, in the
    /// text's last piece (`i` and the spans are offsets in the whole body).
    fn members_from(text: Text<'a>, mut members: Vec<Member>, i: usize) -> Scan<Object<'a>> {
        let (piece, base) = text.last_piece();
        let s = piece.as_bytes();
        let mut i = i - base;
        loop {
            if s.get(i) != Some(&b'"') {
                return Err(ScanError("expected a key"));
            }
            let key_end = string_end(s, i)?;
            let key = (i + 1, key_end - 1);
            i = skip_ws(s, key_end);
            if s.get(i) != Some(&b':') {
                return Err(ScanError("expected ':'"));
            }
            i = skip_ws(s, i + 1);
            let mut spans = Vec::new();
            let end = value_end(s, i, Some(&mut spans))?;
            let member = Member {
                key: (base + key.0, base + key.1),
                value: (base + i, base + end),
                elements: (s[i] == b'[').then(|| {
                    spans
                        .into_iter()
                        .map(|(a, b)| (base + a, base + b))
                        .collect()
                }),
            };
            i = skip_ws(s, end);
            members.push(member);
            match s.get(i) {
                Some(b',') => i = skip_ws(s, i + 1),
                Some(b'}') => break,
                _ => return Err(ScanError("expected ',' or '}'")),
            }
        }
        Object::finish(text, members, base + i)
    }

    /// The object whose closing brace is at `i` (an offset in the whole body, in its last
    /// piece), if nothing but whitespace follows.
    fn finish(text: Text<'a>, members: Vec<Member>, i: usize) -> Scan<Object<'a>> {
        let (piece, base) = text.last_piece();
        if skip_ws(piece.as_bytes(), i - base + 1) != piece.len() {
            return Err(ScanError("trailing bytes after the object"));
        }
        Ok(Object {
            text,
            members,
            unchanged: 0,
        })
    }

    fn member(&self, key: &str) -> Option<&Member> {
        member_index(self.text, &self.members, key).map(|m| &self.members[m])
    }

    /// The raw value of a member (`None` for the history array of a body in two pieces,
    /// which is read by its elements).
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.member(key).and_then(|m| self.text.get(m.value))
    }

    /// The raw elements of a member that is an array; `None` if absent or not an array.
    pub fn elements(&self, key: &str) -> Option<impl ExactSizeIterator<Item = &'a str> + '_> {
        let text = self.text;
        let elements = self.member(key)?.elements.as_ref()?;
        // The exact size lets a long history be collected without growing.
        Some(elements.iter().map(move |&span| {
            let Some((piece, a, b)) = text.locate(span) else {
                return "";
            };
            // What makes the slice below sound, checked by every test that scans.
            debug_assert!(piece.is_char_boundary(a) && piece.is_char_boundary(b));
            match piece.as_bytes().get(a..b) {
                // SAFETY: `piece` is a `str`, and the scan puts both bounds of every element
                // at a char boundary: the value's first byte and the byte after its last,
                // which valid JSON makes ASCII structural bytes (or the body's end). So the
                // slice is valid UTF-8. `str::get` would check that again by reading the
                // body at both bounds: two more of its lines per message, which for a long
                // history are no longer in the cache. No element straddles the pieces
                // (`parse_after` reads a body in two pieces only when they meet at an
                // element's start).
                Some(bytes) => unsafe { std::str::from_utf8_unchecked(bytes) },
                None => "",
            }
        }))
    }

    /// How many of the history's first messages were found byte for byte, in the same
    /// place, in the body this one was read after ([`Object::parse_after`]): those
    /// messages need no comparing.
    pub fn unchanged(&self) -> usize {
        self.unchanged
    }

    /// What this scan found, kept with the body's bytes for [`Object::parse_after`] on a
    /// later body. `None` if `body` is not the body this object was parsed from.
    pub fn into_scanned(self, body: &RequestBytes) -> Option<Scanned> {
        let same = |piece: &str, bytes: &Bytes| {
            piece.as_ptr() == bytes.as_ptr() && piece.len() == bytes.len()
        };
        let same = same(self.text.head, body.head()) && same(self.text.tail, body.tail());
        same.then(|| Scanned {
            body: body.clone(),
            members: self.members,
        })
    }
}

/// A request body that parsed as a JSON object, with where its members and the elements
/// of its arrays lie: what the next request of the same conversation, which repeats most
/// of these bytes, needs to be read after it ([`Object::parse_after`]).
pub struct Scanned {
    /// Valid UTF-8 (only a successful parse makes a `Scanned`, and `Bytes` never change).
    body: RequestBytes,
    members: Vec<Member>,
}

impl Scanned {
    /// The body.
    pub fn body(&self) -> &RequestBytes {
        &self.body
    }

    /// Where a body that repeats this one's first `equal` bytes can be split for
    /// [`Object::parse_after`] to read it after this one: the start of the last element of
    /// the array member `key` that ends within those bytes, or this body's own split if
    /// that comes first (a head is one piece of one buffer). `None` when no element ends
    /// within them.
    pub fn split_for(&self, key: &str, equal: usize) -> Option<usize> {
        let m = member_index_in(&self.body, &self.members, key)?;
        let elements = self.members[m].elements.as_ref()?;
        let within = elements.partition_point(|e| e.1 <= equal);
        let start = elements.get(within.checked_sub(1)?)?.0;
        Some(start.min(self.body.head().len()))
    }
}

/// How many leading bytes of a body that arrives piece by piece are a scanned earlier
/// body's, byte for byte: compared while the client is still sending, so that reading the
/// whole body after that one ([`Object::parse_after`]) need not compare them after the
/// body's last byte, on the request's way upstream. That comparison is most of what
/// reading a long history after its previous request costs (for a 2 MB history ~0.3 ms,
/// spent mostly fetching the earlier body back from memory).
pub struct SharedPrefix {
    /// The earlier body (reference-counted handles).
    old: RequestBytes,
    /// Bytes of the new body seen so far.
    seen: usize,
    /// The new body's first `equal` bytes are `old`'s.
    equal: usize,
}

impl SharedPrefix {
    pub fn new(before: &Scanned) -> SharedPrefix {
        SharedPrefix {
            old: before.body.clone(),
            seen: 0,
            equal: 0,
        }
    }

    /// The body's next bytes. Every piece of the body must pass here, once and in order:
    /// what [`Object::parse_after`] then skips comparing rests on it.
    pub fn arrived(&mut self, piece: &[u8]) {
        let at = self.seen;
        self.seen += piece.len();
        if self.equal != at {
            return; // the bodies already differ
        }
        let n = piece.len().min(self.old.len().saturating_sub(at));
        let Some((first, second)) = self.old.slices(at..at + n) else {
            return;
        };
        let same = common_prefix_len(&piece[..first.len()], first);
        self.equal += same;
        if same == first.len() {
            self.equal += common_prefix_len(&piece[first.len()..n], second);
        }
    }

    /// The earlier body.
    pub fn old(&self) -> &RequestBytes {
        &self.old
    }

    /// How many of the bytes seen so far are the earlier body's.
    pub fn equal(&self) -> usize {
        self.equal
    }

    /// How many of `body`'s first bytes are known to be `before`'s: none unless this
    /// prefix saw exactly `body`'s length, compared against `before`'s very bytes.
    fn known(&self, body: &RequestBytes, before: &Scanned) -> usize {
        if self.old.same_buffers(&before.body) && self.seen == body.len() {
            self.equal
        } else {
            0
        }
    }
}

/// The length of the longest common prefix of two slices of the same length.
fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    if a == b {
        return a.len();
    }
    // Rare (once per body at most): blocks first, then the bytes of the block that differs.
    let mut i = 0;
    while a
        .get(i..i + 64)
        .is_some_and(|x| Some(x) == b.get(i..i + 64))
    {
        i += 64;
    }
    i + a[i..]
        .iter()
        .zip(&b[i..])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn elements<'a>(obj: &Object<'a>, key: &str) -> Option<Vec<&'a str>> {
        obj.elements(key).map(Iterator::collect)
    }

    fn scanned(body: &str) -> Scanned {
        let bytes = RequestBytes::from(Bytes::from(body.to_string()));
        let text = std::str::from_utf8(bytes.head()).unwrap();
        let object = Object::parse(text).unwrap();
        object.into_scanned(&bytes).unwrap()
    }

    fn whole(body: &[u8]) -> RequestBytes {
        RequestBytes::from(Bytes::copy_from_slice(body))
    }

    #[test]
    fn the_first_elements_are_guessed_without_walking_the_members_before_them() {
        let spans = |s: &str, n| {
            first_elements_guessed(s.as_bytes(), "messages", n)
                .into_iter()
                .map(|(a, b)| s[a..b].to_string())
                .collect::<Vec<_>>()
        };
        let exact = |s: &str, n| {
            first_elements(s.as_bytes(), "messages", n)
                .into_iter()
                .map(|(a, b)| s[a..b].to_string())
                .collect::<Vec<_>>()
        };
        // Large members first, in any JSON spacing: the same as the exact walk.
        for body in [
            r#"{"system":[{"type":"text","text":"say \"messages\": [x]"}],"tools":[{"name":"t","input_schema":{"properties":{"messages":{"type":"array"}}}}],"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"c":3}]}"#,
            "{\"model\": \"m\",\n  \"messages\" : [ {\"a\": 1} , {\"b\": [2]} ]}",
            r#"{"messages":[{"a":1}]}"#,
            r#"{"model":"m","max_tokens":5,"system":[{"text":"s"}],"messages":[{"a":1},{"b":2}]}"#,
            r#"{"messages":[]}"#,
        ] {
            for n in [1, 2] {
                assert_eq!(spans(body, n), exact(body, n), "{body}");
            }
        }
        assert_eq!(
            spans(r#"{"system":"s","messages":[{"a":1},{"b":2},{"c":3}]}"#, 2),
            vec![r#"{"a":1}"#, r#"{"b":2}"#]
        );
        // Cut off while arriving: only the elements that are whole.
        assert_eq!(
            spans(r#"{"system":"s","messages":[{"a":1},{"b":"#, 2),
            vec![r#"{"a":1}"#]
        );
        // Not an array (OpenAI Responses' `input` as a string), after a container or not:
        // the exact walk.
        for body in [
            &br#"{"input":"hello"}"#[..],
            br#"{"tools":[1],"input":"hello"}"#,
        ] {
            let found = first_elements_guessed(body, "input", 2);
            assert_eq!(found, first_elements(body, "input", 2));
            assert_eq!(found.len(), 1);
        }
        assert_eq!(first_elements_guessed(b"not json", "messages", 2), vec![]);
        // A nested array of that name before the top-level one is what a guess takes.
        assert_eq!(
            spans(
                r#"{"metadata":{"messages":[{"x":1}]},"messages":[{"a":1},{"b":2}]}"#,
                2
            ),
            vec![r#"{"x":1}"#]
        );
    }

    #[test]
    fn a_shared_prefix_counts_the_bytes_equal_to_the_earlier_body_across_pieces() {
        let before = scanned(r#"{"messages":[{"a":1},{"b":2}],"x":3}"#);
        let fed = |pieces: &[&str]| {
            let mut prefix = SharedPrefix::new(&before);
            for piece in pieces {
                prefix.arrived(piece.as_bytes());
            }
            (prefix.seen, prefix.equal)
        };
        // The same bytes, whatever the pieces.
        assert_eq!(fed(&[r#"{"messages":[{"a":1},{"b":2}],"x":3}"#]), (36, 36));
        assert_eq!(
            fed(&[r#"{"messages":[{"a""#, r#":1},{"b":2}],"x":3}"#]),
            (36, 36)
        );
        // A difference ends the count for good, even where later bytes agree again.
        assert_eq!(
            fed(&[r#"{"messages":[{"a":1},{"b""#, r#":9}],"x":3}"#]),
            (36, 26)
        );
        assert_eq!(
            fed(&[r#"{"messages":[{"a":7"#, r#"},{"b":2}],"x":3}"#]),
            (36, 18)
        );
        // A longer body shares at most the earlier body's length.
        assert_eq!(
            fed(&[r#"{"messages":[{"a":1},{"b":2}],"x":3}"#, "  "]),
            (38, 36)
        );
        // Bytes well past a 64-byte block find the exact place they differ.
        let long = format!(r#"{{"messages":[{{"a":"{}"}}]}}"#, "z".repeat(200));
        let before = scanned(&long);
        let mut prefix = SharedPrefix::new(&before);
        let mut changed = long.clone().into_bytes();
        changed[150] = b'y';
        prefix.arrived(&changed);
        assert_eq!(prefix.equal, 150);
        // Only what was fed for exactly this body's length, against `before` itself, counts.
        assert_eq!(prefix.known(&whole(&changed), &before), 150);
        assert_eq!(prefix.known(&whole(&changed[..100]), &before), 0);
        assert_eq!(prefix.known(&whole(&changed), &scanned(&long)), 0);
    }

    /// `body` read after `before` is read exactly as from scratch (or not resumed at all,
    /// and then read from scratch by the caller); the messages it calls unchanged are.
    /// So is `body` in two pieces, its head `before`'s bytes up to any element both share
    /// ([`Scanned::split_for`] picks one of those), and it resumes exactly when the whole
    /// body does.
    fn check_resumed(before: &Scanned, body: &[u8]) -> Option<usize> {
        let cold = std::str::from_utf8(body)
            .ok()
            .and_then(|text| Object::parse(text).ok());
        let whole_body = whole(body);
        let resumed = Object::parse_after(&whole_body, "messages", before, None);
        let old_spans = {
            let m = member_index_in(&before.body, &before.members, "messages").unwrap();
            before.members[m].elements.clone().unwrap()
        };
        let old = before.body.to_whole();
        let common = old.iter().zip(body).take_while(|(a, b)| a == b).count();
        let mut splits = 0;
        for &(start, end) in &old_spans {
            if end > common || start > before.body.head().len() {
                break;
            }
            let split = RequestBytes::split(
                before.body.head().slice(..start),
                Bytes::copy_from_slice(&body[start..]),
            );
            let in_two = Object::parse_after(&split, "messages", before, None);
            assert_eq!(in_two.is_some(), resumed.is_some(), "split at {start}");
            if let (Some(in_two), Some(resumed)) = (in_two, &resumed) {
                assert_eq!(in_two.members, resumed.members);
                assert_eq!(in_two.unchanged, resumed.unchanged);
                assert_eq!(elements(&in_two, "messages"), elements(resumed, "messages"));
                for m in &resumed.members {
                    let key = resumed.text.get(m.key).unwrap();
                    if key != "messages" {
                        assert_eq!(in_two.get(key), resumed.get(key), "{key}");
                    }
                }
                assert_eq!(in_two.text.head.len(), start);
                splits += 1;
            }
        }
        if splits > 0 {
            // A split that no element both share starts is not read in two pieces.
            let odd = old_spans[0].0 + 1;
            let split = RequestBytes::split(
                before.body.head().slice(..odd),
                Bytes::copy_from_slice(&body[odd..]),
            );
            assert!(Object::parse_after(&split, "messages", before, None).is_none());
        }
        let resumed = resumed?;
        let cold = cold.unwrap_or_else(|| {
            panic!(
                "resumed a body that does not parse: {}",
                String::from_utf8_lossy(body)
            )
        });
        assert_eq!(resumed.members, cold.members, "{}", cold.text.head);
        assert_eq!(resumed.text.head, cold.text.head);
        let old_texts = elements_of(before);
        let new = elements(&resumed, "messages").unwrap_or_default();
        assert!(resumed.unchanged <= new.len().min(old_texts.len()));
        for (&(a, b), message) in old_spans.iter().zip(&new).take(resumed.unchanged) {
            assert_eq!(&body[a..b], &old[a..b]);
            assert_eq!(whole_body.offset_of(message.as_bytes()), Some(a..b));
        }
        Some(resumed.unchanged)
    }

    fn elements_of(scanned: &Scanned) -> Vec<String> {
        let body = String::from_utf8(scanned.body.to_whole().to_vec()).unwrap();
        let m = member_index_in(&scanned.body, &scanned.members, "messages").unwrap();
        scanned.members[m]
            .elements
            .iter()
            .flatten()
            .map(|&(a, b)| body[a..b].to_string())
            .collect()
    }

    const BEFORE: &str = r#"{"model":"m","system":[{"type":"text","text":"be \"brief\""}],"messages":[{"role":"user","content":"fix é"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","input":{"p":"a\\b\n"}}]} , 7,"s"],"tools":[1,2],"stream":true}"#;

    #[test]
    fn a_body_that_continues_the_last_one_is_read_from_where_they_differ() {
        let before = scanned(BEFORE);
        // The usual next request: the same history and one message more.
        let next = BEFORE.replace(r#","s"],"#, r#","s",{"role":"user","content":"ok"}],"#);
        assert_eq!(check_resumed(&before, next.as_bytes()), Some(4));
        // The same body again.
        assert_eq!(check_resumed(&before, BEFORE.as_bytes()), Some(4));
        // The last message changed (a cache marker moved): the first three still hold.
        let marked = BEFORE.replace(r#","s"],"#, r#","t"],"#);
        assert_eq!(check_resumed(&before, marked.as_bytes()), Some(3));
        // A number element that grew is read again, not taken as unchanged.
        let grown = BEFORE.replace(r#" , 7,"#, r#" , 78,"#);
        assert_eq!(check_resumed(&before, grown.as_bytes()), Some(2));
        // A change before the history: nothing to resume from.
        let other = BEFORE.replace(r#""model":"m""#, r#""model":"n""#);
        assert_eq!(check_resumed(&before, other.as_bytes()), None);
    }

    #[test]
    fn one_byte_changed_anywhere_reads_as_from_scratch() {
        let before = scanned(BEFORE);
        let next = BEFORE.replace(r#","s"],"#, r#","s",{"role":"user","content":"ok"}],"#);
        let mut resumed = 0;
        for base in [BEFORE, next.as_str()] {
            let base = base.as_bytes();
            for p in 0..base.len() {
                for byte in [
                    b'x', b'"', b'\\', b']', b'[', b'}', b',', b' ', b'7', 0xC3, 0x80,
                ] {
                    let mut body = base.to_vec();
                    body[p] = byte;
                    resumed += usize::from(check_resumed(&before, &body).is_some());
                    // Removed, and doubled.
                    let mut body = base.to_vec();
                    body.remove(p);
                    check_resumed(&before, &body);
                    let mut body = base.to_vec();
                    body.insert(p, byte);
                    check_resumed(&before, &body);
                }
                // Cut short.
                check_resumed(&before, &base[..p]);
            }
        }
        assert!(resumed > 0, "the resumed path was exercised");
    }

    #[test]
    fn a_long_history_changed_in_any_message_resumes_before_it() {
        let messages: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"role":"user","content":"message {i:02}"}}"#))
            .collect();
        let body = |messages: &[String]| format!(r#"{{"messages":[{}]}}"#, messages.join(","));
        let before = scanned(&body(&messages));
        let mut next = messages.clone();
        next.push(r#"{"role":"user","content":"new"}"#.into());
        assert_eq!(check_resumed(&before, body(&next).as_bytes()), Some(40));
        for changed in 0..40 {
            let mut edited = next.clone();
            edited[changed] = edited[changed].replace("message", "massage");
            let unchanged = check_resumed(&before, body(&edited).as_bytes());
            assert_eq!(
                unchanged,
                changed.checked_sub(1).map(|_| changed),
                "{changed}"
            );
        }
    }

    #[test]
    fn finds_the_same_slices_as_serde() {
        let body = r#" {"model":"m\"x","n":-1.5e3,"t":true,"messages":[ {"a":"}]\\"} ,[1,[2]],"s",null ],"e":{}} "#;
        let obj = Object::parse(body).unwrap();
        assert_eq!(obj.get("model"), Some(r#""m\"x""#));
        assert_eq!(obj.get("n"), Some("-1.5e3"));
        assert_eq!(obj.get("e"), Some("{}"));
        let messages = elements(&obj, "messages").unwrap();
        let serde: Vec<&RawValue> = serde_json::from_str(obj.get("messages").unwrap()).unwrap();
        assert_eq!(messages, serde.iter().map(|r| r.get()).collect::<Vec<_>>());
        assert_eq!(elements(&obj, "model"), None);
        let empty = Object::parse(r#"{"m": [ ]}"#).unwrap();
        assert_eq!(elements(&empty, "m").unwrap().len(), 0);
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
                let ours = elements(&obj, "m").unwrap();
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
