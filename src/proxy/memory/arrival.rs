//! The conversation's last request, found while a body arrives, and the body compared
//! with its bytes frame by frame.
//!
//! Reading a request after its conversation's last one compares the bytes the two share
//! (most of a history). Done after the body's last byte, that comparison sat between the
//! client's last byte and the first byte sent upstream: for a 2 MB history ~0.3 ms, mostly
//! fetching the earlier body back from memory. So the conversation is looked up as soon as
//! the request says which it is (its stated id, from the headers, before any byte of the
//! body; or its first two messages, usually in the first frames), and each frame is
//! compared as it arrives ([`SharedPrefix`]), while the client is still sending.
//! `proxy::forward::body` reads the frames and asks here what they repeat.

use super::history::Compared;
use super::{Memory, Recall, Recalled};
use crate::dialect::Dialect;
use crate::request_bytes::RequestBytes;
use crate::scan::SharedPrefix;

/// How far into a body the first two messages are looked for while it arrives; past this
/// (a body whose history starts late, or holds one message) the key waits for the whole
/// body. Each try scans from the start, and tries are made only when the body has doubled,
/// so all of them together read at most twice this.
const HEAD_SEARCH_MAX: usize = 256 << 10;

/// A body whose conversation's last body is in two pieces with a tail longer than this
/// share of it is read into one buffer of its own (as it arrives, and later read after
/// nothing but its own bytes): each request that shares a head copies the earlier tail
/// once it differs, so tails are kept short.
const TAIL_SHARE_MAX: usize = 16;

/// The conversation's last request, looked up while the body arrives, and how much of the
/// body repeats its bytes.
pub struct BodyComparison<'a> {
    memory: &'a Memory,
    /// `None` on routes that carry no conversation: nothing to look up.
    dialect: Option<Dialect>,
    /// The conversation's slot, once the request said which conversation it is.
    recall: Option<Recall>,
    /// The last request as it was when found, and the body compared with it as it arrives.
    compared: Option<Compared>,
    /// The body's length at the last try to find its first two messages.
    tried_at: usize,
}

/// What [`BodyComparison`] found once the body is whole.
pub struct Predecessor {
    /// The conversation's slot, where this request is put as its last one.
    pub recall: Recall,
    /// What the slot held for this request once its body was whole.
    pub recalled: Recalled,
    /// What the body was compared with while it arrived: the last request as it was then,
    /// which a request of the conversation that finished meanwhile may have replaced.
    pub compared: Option<Compared>,
}

impl<'a> BodyComparison<'a> {
    /// `stated`: the conversation id the request's headers name, if any; the conversation
    /// is then looked up at once.
    pub fn new(
        memory: &'a Memory,
        dialect: Option<Dialect>,
        stated: Option<&str>,
    ) -> BodyComparison<'a> {
        let mut earlier = BodyComparison {
            memory,
            dialect,
            recall: None,
            compared: None,
            tried_at: 0,
        };
        if let Some(id) = stated {
            earlier.look_up(id);
        }
        earlier
    }

    /// Whether the request's conversation is new to this process: on a conversation route,
    /// no last request of it is held (none was seen, or it was forgotten).
    pub fn is_new(&self) -> bool {
        self.dialect.is_some() && self.recall.as_ref().is_none_or(|r| !r.holds_request())
    }

    /// Whether the body rewrites its conversation's history: it repeats less than half of
    /// the last request's body (a compaction's continuation does; so does a side request
    /// under the conversation's id). `false` when there was nothing to compare with.
    pub fn rewrites_history(&self) -> bool {
        (self.compared.as_ref()).is_some_and(|c| 2 * c.prefix.equal() < c.prefix.old().len())
    }

    /// Looks the conversation `key` names up and starts comparing with its last request.
    /// That request's transcript stays where it is until the body is whole
    /// ([`BodyComparison::finish`]): taken now, it would be gone for every other request of
    /// the conversation read meanwhile (64 × 209 KB of one conversation: ~50 % more CPU per
    /// request, each rebuilding its transcript).
    fn look_up(&mut self, key: &str) {
        let Some(dialect) = self.dialect else { return };
        let recall = self.memory.recall(key);
        self.compared = recall.peek().and_then(|request| {
            let prefix = SharedPrefix::new(request.scanned(dialect)?);
            Some(Compared { request, prefix })
        });
        self.recall = Some(recall);
    }

    /// The body so far, of which `new` (the frame that just arrived) is the end.
    pub(in crate::proxy) fn arrived(&mut self, so_far: &[u8], new: &[u8]) {
        let Some(dialect) = self.dialect else { return };
        if self.recall.is_none() {
            if so_far.len() > HEAD_SEARCH_MAX || so_far.len() < 2 * self.tried_at {
                return;
            }
            self.tried_at = so_far.len();
            let head = dialect.first_messages(so_far, 2);
            if head.len() < 2 {
                return;
            }
            self.look_up(&head_key_of(dialect, &head));
            // Everything so far is new to the comparison.
            if let Some(compared) = self.compared.as_mut() {
                compared.prefix.arrived(so_far);
            }
            return;
        }
        if let Some(compared) = self.compared.as_mut() {
            compared.prefix.arrived(new);
        }
    }

    /// Compares the body's next frame, once the last request is known, and says how many
    /// of the body's bytes so far are the last body's.
    pub(in crate::proxy) fn compare(&mut self, frame: &[u8]) -> usize {
        match self.compared.as_mut() {
            Some(compared) => {
                compared.prefix.arrived(frame);
                compared.prefix.equal()
            }
            None => 0,
        }
    }

    /// The last body, when the body so far (`n` bytes) is its first bytes and the body can
    /// share them. Not when that body's own tail is long ([`TAIL_SHARE_MAX`]).
    pub(in crate::proxy) fn sharing(&self, n: usize) -> Option<RequestBytes> {
        let compared = self.compared.as_ref()?;
        let old = compared.prefix.old();
        let short_tail = old.tail().len() <= old.len() / TAIL_SHARE_MAX;
        (short_tail && n > 0 && compared.prefix.equal() == n).then(|| old.clone())
    }

    /// Where a body that repeats the last body's first `equal` bytes starts its own
    /// buffer ([`crate::scan::Scanned::split_for`]); 0 (the body whole) when nothing fits.
    pub(in crate::proxy) fn split_for(&self, equal: usize) -> usize {
        let split = || {
            let dialect = self.dialect?;
            let scanned = self.compared.as_ref()?.request.scanned(dialect)?;
            scanned.split_for(dialect.history_key(), equal)
        };
        split().unwrap_or(0)
    }

    /// Once the body is whole: the conversation's slot (looked up by the body's first
    /// messages if they were not found on the way), what it holds for the request, and
    /// what the body was compared with. `None` on routes that carry no conversation.
    pub fn finish(self, body: &RequestBytes) -> Option<Predecessor> {
        let dialect = self.dialect?;
        // Without a key nothing was compared, so the body is one buffer.
        let recall = match self.recall {
            Some(recall) => recall,
            None => self.memory.recall(&head_key(dialect, &body.to_whole())),
        };
        let same_body = self
            .compared
            .as_ref()
            .is_some_and(|c| c.prefix.equal() == body.len() && c.prefix.old().len() == body.len());
        Some(Predecessor {
            recalled: recall.take(same_body),
            recall,
            compared: self.compared,
        })
    }
}

/// A key for the last request of a conversation that states no id: its first two
/// messages' raw bytes. `#` never appears in conversation ids, so the keys cannot collide.
///
/// xxh3, not blake3: the key only finds a request to compare this one with (the byte
/// comparison decides what is reused), so a collision costs speed, never a wrong reading,
/// and blake3 over a system prompt of a few KB cost ~2 % of a small request's CPU.
pub fn head_key(dialect: Dialect, body: &[u8]) -> String {
    head_key_of(dialect, &dialect.first_messages(body, 2))
}

fn head_key_of(dialect: Dialect, first_messages: &[&[u8]]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&[dialect as u8]);
    for m in first_messages {
        h.update(m);
        h.update(b"\0");
    }
    hex_key("#head-", h.digest128())
}

/// `prefix` and `n` in 32 lowercase hex digits, as `format!("{prefix}{n:032x}")` writes it
/// without the formatting machinery (a tenth of its instructions, once per request).
fn hex_key(prefix: &str, n: u128) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 32];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = DIGITS[(n >> ((31 - i) * 4)) as usize & 0xf];
    }
    let mut key = String::with_capacity(prefix.len() + 32);
    key.push_str(prefix);
    // ASCII digits: always UTF-8.
    key.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    key
}

#[cfg(test)]
mod tests {
    use super::hex_key;

    #[test]
    fn a_hex_key_is_what_format_writes() {
        for n in [0, 1, 0xabc, u128::MAX, u128::MAX / 3, 1 << 127] {
            assert_eq!(hex_key("#head-", n), format!("#head-{n:032x}"));
        }
    }
}
