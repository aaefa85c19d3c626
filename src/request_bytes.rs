//! A request body's bytes: one buffer, or two pieces, a head shared with the
//! conversation's last body and the body's own tail.
//!
//! A request repeats its conversation's last one for most of its length (the history).
//! Keeping those bytes from the earlier body, compared as they arrive rather than copied
//! into a buffer of the request's own, saves a copy of the history per request: for the
//! bench's 2 MB body, ~170 µs of its arrival on two busy cores and a 2 MB buffer in flight
//! (BENCHMARKS.md). `proxy::forward::body` joins them where `proxy::memory::arrival` says: always at
//! the start of a history message, so that a message, a top-level member before the history
//! or one after it lies in one piece and can be read as one slice.

use std::ops::Range;

use bytes::Bytes;

/// A request body's bytes, in one piece or two ([`RequestBytes::split`]).
#[derive(Clone, Debug, Default)]
pub struct RequestBytes {
    /// The body's first bytes; all of them when the body is one piece.
    head: Bytes,
    /// The rest; empty when the body is one piece.
    tail: Bytes,
}

impl From<Bytes> for RequestBytes {
    fn from(whole: Bytes) -> RequestBytes {
        RequestBytes {
            head: whole,
            tail: Bytes::new(),
        }
    }
}

impl RequestBytes {
    /// `head` followed by `tail`, neither copied.
    pub fn split(head: Bytes, tail: Bytes) -> RequestBytes {
        RequestBytes { head, tail }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole body, when it is one piece.
    pub fn whole(&self) -> Option<&Bytes> {
        self.tail.is_empty().then_some(&self.head)
    }

    pub fn head(&self) -> &Bytes {
        &self.head
    }

    pub fn tail(&self) -> &Bytes {
        &self.tail
    }

    /// The head and the tail (empty when the body is one piece).
    pub fn into_pieces(self) -> (Bytes, Bytes) {
        (self.head, self.tail)
    }

    /// The bytes of `range` when they lie in one piece; `None` when they straddle the two
    /// pieces or pass the end.
    pub fn get(&self, range: Range<usize>) -> Option<&[u8]> {
        let split = self.head.len();
        if range.end <= split {
            self.head.get(range)
        } else if range.start >= split {
            self.tail.get(range.start - split..range.end - split)
        } else {
            None
        }
    }

    /// The bytes of `range`, in one or two slices (the second empty unless the range
    /// straddles the pieces); `None` past the end.
    pub fn slices(&self, range: Range<usize>) -> Option<(&[u8], &[u8])> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        let split = self.head.len();
        let first = &self.head[range.start.min(split)..range.end.min(split)];
        let second = &self.tail[range.start.max(split) - split..range.end.max(split) - split];
        Some((first, second))
    }

    /// Whether `self`'s `range` holds the same bytes as `other`'s `other_range` (false
    /// when either passes its body's end).
    pub fn range_eq(
        &self,
        range: Range<usize>,
        other: &RequestBytes,
        other_range: Range<usize>,
    ) -> bool {
        let Some((a, b)) = self.slices(range) else {
            return false;
        };
        let at = other_range.start;
        other_range.len() == a.len() + b.len() && other.holds(at, a) && other.holds(at + a.len(), b)
    }

    /// Whether the body's bytes from `at` on are `bytes`.
    fn holds(&self, at: usize, bytes: &[u8]) -> bool {
        match self.slices(at..at + bytes.len()) {
            Some((first, second)) => {
                bytes[..first.len()] == *first && bytes[first.len()..] == *second
            }
            None => false,
        }
    }

    /// Where `part`, a slice of one of the pieces, lies in the body.
    pub fn offset_of(&self, part: &[u8]) -> Option<Range<usize>> {
        for (piece, base) in [(&self.head, 0), (&self.tail, self.head.len())] {
            let start = (part.as_ptr() as usize).wrapping_sub(piece.as_ptr() as usize);
            if start <= piece.len() && part.len() <= piece.len() - start && !piece.is_empty() {
                return Some(base + start..base + start + part.len());
            }
        }
        // An empty body's only slice is empty.
        (self.is_empty() && part.is_empty()).then_some(0..0)
    }

    /// Whether `self` and `other` are the same pieces of the same buffers (not merely the
    /// same bytes).
    pub fn same_buffers(&self, other: &RequestBytes) -> bool {
        let same = |a: &Bytes, b: &Bytes| a.as_ptr() == b.as_ptr() && a.len() == b.len();
        same(&self.head, &other.head) && same(&self.tail, &other.tail)
    }

    /// The body in one buffer: itself when it is one piece, else a copy of both pieces
    /// (for the rare reader that needs one slice: a body that did not parse after the
    /// last one, or one an intervention rewrites).
    pub fn to_whole(&self) -> Bytes {
        match self.whole() {
            Some(whole) => whole.clone(),
            None => {
                let mut joined = Vec::with_capacity(self.len());
                joined.extend_from_slice(&self.head);
                joined.extend_from_slice(&self.tail);
                Bytes::from(joined)
            }
        }
    }
}

impl PartialEq<[u8]> for RequestBytes {
    fn eq(&self, other: &[u8]) -> bool {
        other.len() == self.len() && self.holds(0, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str, at: usize) -> RequestBytes {
        let bytes = Bytes::copy_from_slice(text.as_bytes());
        RequestBytes::split(bytes.slice(..at), bytes.slice(at..))
    }

    #[test]
    fn every_read_of_a_split_body_is_the_whole_body_s() {
        let text = "0123456789abcdef";
        let whole = RequestBytes::from(Bytes::from_static(text.as_bytes()));
        for at in 0..=text.len() {
            let body = split(text, at);
            assert_eq!(body.len(), text.len());
            assert!(body == *text.as_bytes());
            assert_eq!(body.to_whole(), text.as_bytes());
            assert_eq!(body.head().len() + body.tail().len(), text.len());
            for start in 0..=text.len() {
                for end in start..=text.len() + 1 {
                    let expected = text.as_bytes().get(start..end);
                    let inside = end <= at || start >= at;
                    assert_eq!(
                        body.get(start..end),
                        expected.filter(|_| inside),
                        "{at} {start}..{end}"
                    );
                    let joined = body.slices(start..end).map(|(a, b)| [a, b].concat());
                    assert_eq!(joined.as_deref(), expected, "{at} {start}..{end}");
                    // Against the whole body, and against the body split elsewhere.
                    for other in [&whole, &split(text, 5)] {
                        assert_eq!(
                            body.range_eq(start..end, other, start..end),
                            expected.is_some(),
                            "{at} {start}..{end}"
                        );
                    }
                }
            }
        }
        // Different bytes, and different lengths, are not equal.
        let other = RequestBytes::from(Bytes::from_static(b"0123456789abcdeX"));
        assert!(!split(text, 7).range_eq(0..16, &other, 0..16));
        assert!(split(text, 7).range_eq(0..15, &other, 0..15));
        assert!(!split(text, 7).range_eq(0..15, &other, 0..14));
    }

    #[test]
    fn a_slice_of_either_piece_is_found_where_it_lies() {
        let body = split("{\"a\":1,\"b\":2}", 7);
        let head = body.head().clone();
        let tail = body.tail().clone();
        assert_eq!(body.offset_of(&head[1..4]), Some(1..4));
        assert_eq!(body.offset_of(&tail[2..5]), Some(9..12));
        assert_eq!(body.offset_of(&tail[..]), Some(7..13));
        assert_eq!(body.offset_of(b"elsewhere"), None);
        assert!(body.whole().is_none());
        assert!(RequestBytes::from(head.clone()).whole().is_some());
        assert!(body.same_buffers(&body.clone()));
        assert!(!body.same_buffers(&split("{\"a\":1,\"b\":2}", 7)));
    }
}
