//! A request's history, read after its conversation's last request, and the parsed
//! messages, cached by the blake3 hash of their raw bytes.
//!
//! Every request carries the whole history, so without a cache the proxy would parse the
//! same messages again on every turn. Here each message is parsed once; later requests
//! recognise it by comparing its bytes with the last request's, or hash it and find its
//! items. The key is the content (plus the wire format), not the
//! conversation: the result of parsing depends on the bytes alone, so the cache can never
//! make two conversations see different transcripts, and identity mistakes cannot hurt it.
//!
//! Bounded two ways: a message no request carried for `idle` is dropped by [`sweep`], and
//! when the raw bytes held exceed `max_bytes` the least recently used quarter goes.
//!
//! [`sweep`]: MessageCache::sweep

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::actions::ToolCatalog;
use crate::detect::Folded;
use crate::dialect::{Dialect, ParseError, RawMessage, RequestView};
use crate::proxy::identity::Identity;
use crate::request_bytes::RequestBytes;
use crate::scan::{self, Scanned, SharedPrefix};
use crate::transcript::{Item, Transcript};

/// The items of one message, shared between the cache and requests in flight.
pub type Items = Arc<[Item]>;

struct Entry {
    items: Items,
    /// Raw size of the message: what the byte budget counts.
    bytes: usize,
    last_used: Instant,
}

#[derive(Default)]
struct Inner {
    map: HashMap<blake3::Hash, Entry>,
    bytes: usize,
}

pub struct MessageCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
    idle: Duration,
}

impl MessageCache {
    pub fn new(max_bytes: usize, idle: Duration) -> MessageCache {
        MessageCache {
            inner: Mutex::new(Inner::default()),
            max_bytes,
            idle,
        }
    }

    /// The items of each message, in order, parsing only the messages not cached.
    /// Messages that `previous` (the conversation's last request) carried at the same
    /// position with the same bytes are recognised by comparing bytes, which is several
    /// times cheaper than hashing them, or without even that for the first `unchanged`
    /// ones, which the scan of the body already found to be `previous`'s own
    /// ([`scan::Object::unchanged`] of a body read after [`LastRequest::scanned`]); the others are
    /// looked up by hash. The lock is held only for lookups and inserts, never while
    /// parsing.
    pub fn items(
        &self,
        dialect: Dialect,
        messages: &[RawMessage],
        previous: Option<&LastRequest>,
        unchanged: usize,
    ) -> ItemList {
        let mut out = previous
            .map(|p| &*p.read)
            .filter(|p| p.dialect == dialect)
            .map_or_else(ItemList::default, |p| {
                p.items.prefix(unchanged.min(messages.len()))
            });
        // The rest (usually the newest turn): compared, looked up or parsed.
        let start = out.len();
        let messages = &messages[start..];
        let mut found: Vec<Option<Items>> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| previous.and_then(|p| p.same(dialect, start + i, m.get())))
            .collect();
        let keys: Vec<Option<blake3::Hash>> = found
            .iter()
            .zip(messages)
            .map(|(slot, raw)| {
                slot.is_none().then(|| {
                    let mut h = blake3::Hasher::new();
                    h.update(&[dialect as u8]);
                    h.update(raw.get().as_bytes());
                    h.finalize()
                })
            })
            .collect();
        let now = Instant::now();
        if keys.iter().any(Option::is_some) {
            let mut inner = self.lock();
            for (slot, key) in found.iter_mut().zip(&keys) {
                if let Some(entry) = key.as_ref().and_then(|k| inner.map.get_mut(k)) {
                    entry.last_used = now;
                    *slot = Some(entry.items.clone());
                }
            }
        }
        let mut parsed = Vec::new();
        for (i, slot) in found.iter_mut().enumerate() {
            if slot.is_none() {
                let items: Items = dialect.parse_message(messages[i].get()).into();
                parsed.push((i, items.clone()));
                *slot = Some(items);
            }
        }
        if !parsed.is_empty() {
            let mut inner = self.lock();
            for (i, items) in parsed {
                let Some(key) = keys[i] else { continue };
                let bytes = messages[i].get().len();
                let entry = Entry {
                    items,
                    bytes,
                    last_used: now,
                };
                if let Some(old) = inner.map.insert(key, entry) {
                    inner.bytes -= old.bytes;
                }
                inner.bytes += bytes;
            }
            if inner.bytes > self.max_bytes {
                evict_oldest_quarter(&mut inner);
            }
        }
        out.push_part(found.into_iter().flatten().collect());
        out
    }

    /// Drops messages idle for longer than the configured time. Called periodically.
    pub fn sweep(&self) {
        let Some(cutoff) = Instant::now().checked_sub(self.idle) else {
            return;
        };
        let mut inner = self.lock();
        let mut freed = 0;
        inner.map.retain(|_, e| {
            let keep = e.last_used >= cutoff;
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        inner.bytes -= freed;
    }

    /// Number of messages and raw bytes held.
    pub fn size(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.map.len(), inner.bytes)
    }

    /// Reads a request's history after its conversation's last request (`previous`, when
    /// known): the scan resumes after the bytes both bodies share, unchanged messages come
    /// from the cache ([`MessageCache::items`]), and the usual request, which adds a turn
    /// to the last one, extends that request's transcript rather than copying every
    /// cached item into a new one (which grows with the history).
    ///
    /// `compared`, when the body was compared while it arrived, is what it was compared
    /// with: the scan resumes after that request (the bytes found equal are not compared
    /// again), even when it is no longer the conversation's last one.
    pub fn read_history(
        &self,
        dialect: Dialect,
        body: &RequestBytes,
        stream_path: bool,
        mut previous: Option<LastRequest>,
        compared: Option<&Compared>,
    ) -> Result<History, ParseError> {
        let read_after = compared.map(|c| &c.request).or(previous.as_ref());
        let joined: RequestBytes;
        let (body, object) = match resumed_scan(dialect, body, read_after, compared) {
            Some(object) => (body, object),
            None if body.whole().is_some() => (body, dialect.scan(body.head())?),
            // A body in two pieces is read joined when its tail cannot be read after the
            // request its head was taken from (its tail is not valid JSON, say); it is then
            // kept joined.
            None => {
                joined = RequestBytes::from(body.to_whole());
                (&joined, dialect.scan(joined.head())?)
            }
        };
        let view = dialect.view_scanned(&object, stream_path)?;
        let preamble = Preamble::read(dialect, body, view.preamble_source, read_after);
        let tools = ToolsRead::of(view.tools, read_after);
        let unchanged = object.unchanged();
        let messages = self.items(dialect, &view.messages, read_after, unchanged);
        // The very same items as the request the fold decided: the same transcript.
        let vouched = read_after
            .filter(|p| p.holds_same(&preamble, &messages))
            .and_then(|p| p.folded);
        let continued = previous
            .as_mut()
            .and_then(|p| p.continue_transcript(&preamble, &messages));
        let Continued {
            transcript,
            head,
            folded,
        } = continued.unwrap_or_else(|| Continued {
            transcript: Transcript::from_items(
                preamble
                    .items
                    .iter()
                    .cloned()
                    .chain(messages.iter().flat_map(|m| m.iter().cloned())),
            ),
            head: None,
            folded: vouched,
        });
        let RequestView {
            model,
            stream,
            messages: raw,
            ..
        } = view;
        let scanned = object.into_scanned(body);
        Ok(History {
            transcript,
            head,
            folded,
            tools: tools.as_ref().map(|t| t.catalog.clone()),
            tools_fingerprint: tools.as_ref().map(|t| t.fingerprint),
            request: LastRequest::new(dialect, body, &raw, messages, scanned, tools, preamble),
            model,
            stream,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves a consistent map: keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request's history as [`MessageCache::read_history`] read it.
pub struct History {
    pub transcript: Transcript,
    /// The identity the transcript's head names ([`crate::proxy::identity::from_head`]), when this
    /// request continues one that kept it and the head is still the same (no need to hash
    /// it again).
    pub head: Option<Identity>,
    /// What the fold that decided the continued request knows of this transcript, for
    /// `Engine::decide_shared`.
    pub folded: Option<Folded>,
    /// What the request's tool definitions say of its tools, for the engine to read calls
    /// of tools no profile knows.
    pub tools: Option<Arc<ToolCatalog>>,
    /// A hash of the tool definitions' bytes (`None`: the request offers none).
    pub tools_fingerprint: Option<u64>,
    /// This request, to keep as its conversation's last one (with the transcript, through
    /// [`LastRequest::keep_transcript`], once the request is done with it).
    pub request: LastRequest,
    pub model: Option<String>,
    pub stream: bool,
}

/// The conversation's last request as it was when a body started arriving, and how much
/// of the body repeats its bytes ([`SharedPrefix`], compared frame by frame).
///
/// Kept until the body is read, because the conversation's last request may change
/// meanwhile: with several requests of one conversation in flight, one that finishes
/// replaces it. Reading after the new one would compare the whole shared history again
/// after the body's last byte (2 MB: ~270 k instructions on the request's way upstream),
/// which is what comparing while the body arrives is for.
pub struct Compared {
    pub request: LastRequest,
    pub prefix: SharedPrefix,
}

/// A conversation's last request: what was read in it, shared by every request that reads
/// after it (concurrent requests of one conversation all do: see [`LastRequest::lend`]), and
/// its transcript, which goes to one of them.
pub struct LastRequest {
    read: Arc<Read>,
    /// The transcript the request was read into (once the request is done with it): the
    /// next request extends it with its new messages instead of copying every cached item
    /// into a fresh one.
    transcript: Option<KeptTranscript>,
    /// The fold that decided the request, with the steps it folded: what a request with
    /// the very same messages knows of its transcript even without the kept one.
    folded: Option<Folded>,
}

/// A request's transcript, kept for the conversation's next request.
struct KeptTranscript {
    transcript: Transcript,
    /// The identity its head names, when the request computed it.
    head: Option<Identity>,
}

/// A kept transcript extended with a request's new messages.
pub struct Continued {
    pub transcript: Transcript,
    /// The kept head identity, while the head it was computed from is unchanged.
    pub head: Option<Identity>,
    /// The kept fold, over the steps the new messages left untouched.
    pub folded: Option<Folded>,
}

/// A request's body (a reference-counted handle, not a copy), its scan, where each message
/// lies in it, the message's items, its preamble and its tool definitions.
struct Read {
    dialect: Dialect,
    body: RequestBytes,
    /// The body's scan, to read the next request after it.
    scanned: Option<Scanned>,
    spans: Vec<Option<Range<usize>>>,
    items: ItemList,
    preamble: Preamble,
    tools: Option<ToolsRead>,
}

/// The items a request's top-level system member gives, which its transcript starts
/// with, and where that member lies in its body.
#[derive(Clone, Default)]
struct Preamble {
    span: Option<Range<usize>>,
    items: Arc<[Item]>,
}

impl Preamble {
    /// The preamble of `source` (a member of `body`), or the last request's when its
    /// member had the same bytes: a system prompt of a few KB is the same in every request
    /// of a conversation, and reading it again was most of the work of reading a small
    /// request's top level (13 k of 18 k instructions for the bench's 8.8 KB Anthropic
    /// request; Claude Code's system prompt is four times as long).
    fn read(
        dialect: Dialect,
        body: &RequestBytes,
        source: Option<&str>,
        last: Option<&LastRequest>,
    ) -> Preamble {
        let Some(source) = source else {
            return Preamble::default();
        };
        let span = body.offset_of(source.as_bytes());
        let kept = last
            .map(|l| &*l.read)
            .filter(|r| r.dialect == dialect)
            .and_then(|r| Some((r.body.get(r.preamble.span.clone()?)?, &r.preamble)));
        match kept {
            Some((bytes, kept)) if bytes == source.as_bytes() => Preamble {
                span,
                items: kept.items.clone(),
            },
            _ => Preamble {
                span,
                items: dialect.read_preamble(Some(source)).into(),
            },
        }
    }

    fn same(&self, other: &Preamble) -> bool {
        Arc::ptr_eq(&self.items, &other.items) || self.items == other.items
    }
}

/// The scan of `body` resumed after `last`'s ([`scan::Object::parse_after`]), skipping the
/// bytes `compared` already found equal while the body arrived. `None` when it cannot be
/// resumed: the body is then scanned from its start.
fn resumed_scan<'b>(
    dialect: Dialect,
    body: &'b RequestBytes,
    last: Option<&LastRequest>,
    compared: Option<&Compared>,
) -> Option<scan::Object<'b>> {
    let after = last?.scanned(dialect)?;
    let prefix = compared.map(|c| &c.prefix);
    scan::Object::parse_after(body, dialect.history_key(), after, prefix)
}

/// A request's tool definitions, read into a catalog.
#[derive(Clone)]
pub struct ToolsRead {
    /// The definitions' raw JSON, to tell the next request's apart.
    raw: Arc<str>,
    catalog: Arc<ToolCatalog>,
    /// A hash of `raw`, made once when it is read: what a run's summary request must offer
    /// ([`super::Stamp`]).
    fingerprint: u64,
}

impl ToolsRead {
    /// Reads `raw`, the definitions a request offers, unless they are the same bytes as
    /// `previous`'s (as in most requests of a conversation): then its catalog is shared,
    /// and the cost is one comparison of the definitions (a few hundred instructions for
    /// a coding agent's 4 KB of them; a hash was several times that), not a parse.
    fn of(raw: Option<&str>, previous: Option<&LastRequest>) -> Option<ToolsRead> {
        let raw = raw?;
        if let Some(kept) = previous.and_then(|p| p.read.tools.as_ref()) {
            if *kept.raw == *raw {
                return Some(kept.clone());
            }
        }
        // Definitions that are not JSON read as no definitions: calls are then read from
        // their arguments alone.
        let value: serde_json::Value = serde_json::from_str(raw).ok()?;
        Some(ToolsRead {
            fingerprint: super::fingerprint(raw.as_bytes()),
            raw: Arc::from(raw),
            catalog: Arc::new(ToolCatalog::from_definitions(&value)),
        })
    }
}

impl LastRequest {
    /// `messages` are slices of `body` (as the dialect's view hands them out), `scanned`
    /// the scan of `body`.
    fn new(
        dialect: Dialect,
        body: &RequestBytes,
        messages: &[RawMessage],
        items: ItemList,
        scanned: Option<Scanned>,
        tools: Option<ToolsRead>,
        preamble: Preamble,
    ) -> LastRequest {
        let spans = messages
            .iter()
            .map(|m| body.offset_of(m.get().as_bytes()))
            .collect();
        // A scan of another body would describe bytes this one may not have.
        let scanned = scanned.filter(|s| s.body().same_buffers(body));
        LastRequest {
            read: Arc::new(Read {
                dialect,
                body: body.clone(),
                scanned,
                spans,
                items,
                preamble,
                tools,
            }),
            transcript: None,
            folded: None,
        }
    }

    /// This request for a next one to read after: what was read is shared (a concurrent
    /// request of the conversation may read after it too), the transcript is handed over.
    pub fn lend(&mut self) -> LastRequest {
        LastRequest {
            read: self.read.clone(),
            transcript: self.transcript.take(),
            folded: self.folded,
        }
    }

    /// What was read, without the transcript: to compare a request's bytes with while it
    /// arrives, leaving the transcript to whichever request of the conversation is read
    /// first ([`LastRequest::lend`]).
    pub fn share(&self) -> LastRequest {
        LastRequest {
            read: self.read.clone(),
            transcript: None,
            folded: self.folded,
        }
    }

    /// The scan of this request's body, to read a request of `dialect` after it.
    pub fn scanned(&self, dialect: Dialect) -> Option<&Scanned> {
        let read = &*self.read;
        read.scanned.as_ref().filter(|_| read.dialect == dialect)
    }

    /// The body's length: what its memory is charged by.
    pub fn body_len(&self) -> usize {
        self.read.body.len()
    }

    /// The transcript kept with this request, if any.
    pub fn transcript(&self) -> Option<&Transcript> {
        self.transcript.as_ref().map(|k| &k.transcript)
    }

    /// Keeps the transcript this request's preamble and messages were read into, the
    /// identity its head names if the request computed it, and the fold that decided the
    /// request (`EngineState::folded`) if one did.
    pub fn keep_transcript(
        &mut self,
        transcript: Transcript,
        head: Option<Identity>,
        folded: Option<Folded>,
    ) {
        self.transcript = Some(KeptTranscript { transcript, head });
        self.folded = folded;
    }

    /// Whether a request read as `preamble` and `messages` holds the very same parsed items
    /// as this one, in the same places, and nothing more: its transcript is this one's.
    fn holds_same(&self, preamble: &Preamble, messages: &ItemList) -> bool {
        messages.len() == self.read.items.len()
            && self.read.preamble.same(preamble)
            && messages.starts_with_same(&self.read.items)
    }

    /// The transcript of a request that carries this one's messages unchanged (the very
    /// same parsed items, in the same places) and the same preamble, then `messages` past
    /// them: the kept transcript, extended with the new messages. `None` when the request
    /// does not continue this one (or no transcript was kept).
    fn continue_transcript(
        &mut self,
        preamble: &Preamble,
        messages: &ItemList,
    ) -> Option<Continued> {
        self.transcript.as_ref()?;
        let n = self.read.items.len();
        let continues =
            self.read.preamble.same(preamble) && messages.starts_with_same(&self.read.items);
        if !continues {
            return None;
        }
        let KeptTranscript {
            mut transcript,
            head,
        } = self.transcript.take()?;
        // The head is the first system text and the first task: new items only append, so
        // it stays the same unless one of them was missing and the new items bring it.
        let had = (transcript.system.is_empty(), transcript.task.is_empty());
        // What came last before the new messages, as `from_items` would have seen it.
        let after_assistant = self
            .read
            .items
            .iter()
            .rev()
            .flat_map(|m| m.iter().rev())
            .chain(preamble.items.iter().rev())
            .next()
            .is_some_and(|i| matches!(i, Item::Assistant { .. } | Item::AssistantPart { .. }));
        let untouched = transcript.extend_items(
            messages.iter_from(n).flat_map(|m| m.iter().cloned()),
            after_assistant,
        );
        let head =
            head.filter(|_| had == (transcript.system.is_empty(), transcript.task.is_empty()));
        Some(Continued {
            transcript,
            head,
            folded: self.folded.map(|f| f.within(untouched)),
        })
    }

    /// The items of message `i` when the previous request had the same bytes there.
    fn same(&self, dialect: Dialect, i: usize, text: &str) -> Option<Items> {
        let read = &*self.read;
        if read.dialect != dialect {
            return None;
        }
        let span = read.spans.get(i)?.clone()?;
        if read.body.get(span)? != text.as_bytes() {
            return None;
        }
        read.items.get(i).cloned()
    }
}

/// Each message's items, in order. A request's list shares its first parts with its
/// conversation's last request's (the messages the two have in common), and adds a part
/// of its own for the rest. One reference per message instead would touch every unchanged
/// message's items: 468 reference counts on items spread over the heap, ~14 µs of cache
/// misses on a 2 MB request's way upstream, growing with the history (BENCHMARKS.md).
#[derive(Clone, Default)]
pub struct ItemList {
    parts: Vec<Part>,
}

#[derive(Clone)]
struct Part {
    items: Arc<[Items]>,
    /// How many of `items`, from the first, belong to the list: a request that changed a
    /// message takes its predecessor's parts only up to it.
    len: usize,
}

/// A list that would have more parts than this is joined into one part. A conversation's
/// list gains a part per request (its new messages), and finding a message walks the
/// parts; joining copies one reference per message, once every this many requests.
const MAX_PARTS: usize = 16;

impl ItemList {
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The items of message `i`.
    fn get(&self, mut i: usize) -> Option<&Items> {
        for part in &self.parts {
            if i < part.len {
                return part.items.get(i);
            }
            i -= part.len;
        }
        None
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &Items> + '_ {
        self.parts.iter().flat_map(|p| p.items[..p.len].iter())
    }

    /// The items of the messages from `start` on, without walking those before it.
    fn iter_from(&self, mut start: usize) -> impl Iterator<Item = &Items> + '_ {
        self.parts.iter().flat_map(move |p| {
            let skip = start.min(p.len);
            start -= skip;
            p.items[skip..p.len].iter()
        })
    }

    /// The first `n` messages' items (all of them if there are fewer), sharing this list's
    /// parts rather than copying their references.
    fn prefix(&self, n: usize) -> ItemList {
        let mut out = ItemList::default();
        let mut left = n;
        for part in &self.parts {
            if left == 0 {
                break;
            }
            let len = part.len.min(left);
            out.parts.push(Part {
                items: part.items.clone(),
                len,
            });
            left -= len;
        }
        out
    }

    /// Appends `items` as a part of their own, then joins every part into one if there
    /// are more than [`MAX_PARTS`].
    fn push_part(&mut self, items: Vec<Items>) {
        if items.is_empty() {
            return;
        }
        self.parts.push(Part {
            len: items.len(),
            items: items.into(),
        });
        if self.parts.len() > MAX_PARTS {
            let joined: Arc<[Items]> = self.iter().cloned().collect();
            self.parts = vec![Part {
                len: joined.len(),
                items: joined,
            }];
        }
    }

    /// Whether this list starts with `other`'s messages as the very same parsed items
    /// (not merely equal ones): by its parts when this list took them from `other`
    /// ([`ItemList::prefix`]), item by item otherwise (after a join).
    fn starts_with_same(&self, other: &ItemList) -> bool {
        if self.len() < other.len() {
            return false;
        }
        let Some((last, whole)) = other.parts.split_last() else {
            return true;
        };
        let shared = self.parts.len() >= other.parts.len()
            && whole
                .iter()
                .zip(&self.parts)
                .all(|(a, b)| Arc::ptr_eq(&a.items, &b.items) && a.len == b.len)
            && Arc::ptr_eq(&last.items, &self.parts[whole.len()].items)
            && last.len <= self.parts[whole.len()].len;
        shared
            || other
                .iter()
                .zip(self.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

#[cfg(test)]
impl std::ops::Index<usize> for ItemList {
    type Output = Items;

    fn index(&self, i: usize) -> &Items {
        self.get(i).expect("message index within the list")
    }
}

/// Rare (only when over budget), so a sort is fine; evicting a quarter at once keeps it rare.
fn evict_oldest_quarter(inner: &mut Inner) {
    let mut ages: Vec<Instant> = inner.map.values().map(|e| e.last_used).collect();
    ages.sort_unstable();
    let Some(&cutoff) = ages.get(ages.len() / 4) else {
        return;
    };
    let mut freed = 0;
    inner.map.retain(|_, e| {
        let keep = e.last_used > cutoff;
        if !keep {
            freed += e.bytes;
        }
        keep
    });
    inner.bytes -= freed;
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::actions::Role;
    use serde_json::value::RawValue;

    fn raws(texts: &[&str]) -> Vec<Box<RawValue>> {
        texts
            .iter()
            .map(|t| RawValue::from_string(t.to_string()).unwrap())
            .collect()
    }

    /// Distinct items for `n` messages (told apart by their pointers).
    fn some_items(n: usize) -> Vec<Items> {
        (0..n).map(|_| Arc::from(Vec::<Item>::new())).collect()
    }

    proptest::proptest! {
        /// Lists built as requests build them (a prefix of the last request's, then new
        /// messages) read as the plain list of references they stand for.
        #[test]
        fn an_item_list_reads_as_the_flat_list_it_stands_for(
            steps in proptest::collection::vec((0usize..40, 0usize..6), 1..60)
        ) {
            let mut list = ItemList::default();
            let mut flat: Vec<Items> = Vec::new();
            for (keep, add) in steps {
                let earlier = list.clone();
                let earlier_flat = flat.clone();
                let keep = keep.min(flat.len() + 1);
                list = list.prefix(keep);
                flat.truncate(keep);
                let new = some_items(add);
                list.push_part(new.clone());
                flat.extend(new);
                proptest::prop_assert!(list.parts.len() <= MAX_PARTS);
                proptest::prop_assert_eq!(list.len(), flat.len());
                let same = |a: Vec<&Items>, b: &[Items]| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
                };
                proptest::prop_assert!(same(list.iter().collect(), &flat));
                let backwards: Vec<Items> = flat.iter().rev().cloned().collect();
                proptest::prop_assert!(same(list.iter().rev().collect(), &backwards));
                for i in 0..=flat.len() {
                    proptest::prop_assert!(same(list.iter_from(i).collect(), &flat[i..]));
                    proptest::prop_assert_eq!(
                        list.get(i).map(Arc::as_ptr),
                        flat.get(i).map(Arc::as_ptr)
                    );
                }
                let starts = flat.len() >= earlier_flat.len()
                    && earlier_flat.iter().zip(&flat).all(|(a, b)| Arc::ptr_eq(a, b));
                proptest::prop_assert_eq!(list.starts_with_same(&earlier), starts);
            }
        }
    }

    #[test]
    fn known_messages_come_from_the_cache() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let owned = raws(&[
            r#"{"role":"user","content":"a"}"#,
            r#"{"role":"user","content":"b"}"#,
        ]);
        let msgs: Vec<RawMessage> = owned.iter().map(|b| RawMessage::new(b.get())).collect();
        let first = cache.items(Dialect::OpenAiChat, &msgs, None, 0);
        assert_eq!(cache.size().0, 2);
        let again = cache.items(Dialect::OpenAiChat, &msgs, None, 0);
        assert!(
            Arc::ptr_eq(&first[0], &again[0]),
            "second lookup reuses the parsed items"
        );
        // Same bytes under another wire format are another message.
        cache.items(Dialect::Anthropic, &msgs[..1], None, 0);
        assert_eq!(cache.size().0, 3);
    }

    #[test]
    fn budget_and_idle_time_bound_the_cache() {
        let cache = MessageCache::new(100, Duration::from_secs(3600));
        let texts: Vec<String> = (0..20).map(|i| format!(r#"{{"n":"{i:010}"}}"#)).collect();
        let owned = raws(&texts.iter().map(String::as_str).collect::<Vec<_>>());
        for raw in &owned {
            cache.items(Dialect::OpenAiChat, &[RawMessage::new(raw.get())], None, 0);
        }
        assert!(cache.size().1 <= 100, "{:?}", cache.size());

        let cache = MessageCache::new(1 << 20, Duration::ZERO);
        cache.items(
            Dialect::OpenAiChat,
            &[RawMessage::new(owned[0].get())],
            None,
            0,
        );
        std::thread::sleep(Duration::from_millis(2));
        cache.sweep();
        assert_eq!(cache.size(), (0, 0));
    }

    #[test]
    fn concurrent_requests_all_read_after_the_last_one_and_one_gets_its_transcript() {
        let body = RequestBytes::from(Bytes::from_static(
            br#"{"messages":[{"role":"user","content":"a"}]}"#,
        ));
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let mut last = cache
            .read_history(Dialect::OpenAiChat, &body, false, None, None)
            .unwrap()
            .request;
        last.keep_transcript(Transcript::default(), None, None);
        let first = last.lend();
        let second = last.lend();
        for lent in [&first, &second] {
            assert!(lent.scanned(Dialect::OpenAiChat).is_some());
            assert!(lent.scanned(Dialect::Anthropic).is_none());
        }
        assert!(first.transcript.is_some() && second.transcript.is_none());
        assert!(Arc::ptr_eq(&first.read, &second.read), "shared, not copied");
    }

    #[test]
    fn tool_definitions_are_read_once_while_their_bytes_stay_the_same() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let def = |name: &str| {
            format!(
                r#"[{{"type":"function","function":{{"name":"{name}","parameters":{{"properties":{{"command":{{"type":"string"}}}}}}}}}}]"#
            )
        };
        let body = |tools: &str, turns: usize| {
            let mut messages = vec![r#"{"role":"user","content":"task"}"#.to_string()];
            messages
                .extend((0..turns).map(|i| format!(r#"{{"role":"assistant","content":"{i}"}}"#)));
            RequestBytes::from(Bytes::from(format!(
                r#"{{"messages":[{}],"tools":{tools}}}"#,
                messages.join(",")
            )))
        };
        let read = |body: &RequestBytes, previous: Option<LastRequest>| {
            cache
                .read_history(Dialect::OpenAiChat, body, false, previous, None)
                .unwrap()
        };
        let first = read(&body(&def("run"), 0), None);
        let catalog = first.tools.clone().expect("definitions read");
        assert_eq!(catalog.roles("run").unwrap()["command"], Role::Command);
        // The next request, the same definitions: the same catalog, not read again.
        let second = read(&body(&def("run"), 1), Some(first.request));
        assert!(Arc::ptr_eq(second.tools.as_ref().unwrap(), &catalog));
        // Definitions that changed are read anew.
        let third = read(&body(&def("exec"), 2), Some(second.request));
        assert_eq!(
            third.tools.unwrap().roles("exec").unwrap()["command"],
            Role::Command
        );
        // No tools offered, or definitions that are not JSON: nothing to read.
        assert!(read(&body("[]", 0), None).tools.is_none());
        let broken = RequestBytes::from(Bytes::from_static(
            br#"{"messages":[{"role":"user","content":"t"}],"tools":[{"name":"x","parameters":[}]}"#,
        ));
        assert!(cache
            .read_history(Dialect::OpenAiChat, &broken, false, None, None)
            .map_or(true, |h| h.tools.is_none()));
    }

    #[test]
    fn a_continued_transcript_keeps_its_head_identity_while_the_head_is_the_same() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let user = r#"{"role":"user","content":"the task"}"#;
        let turn = r#"{"role":"assistant","content":"on it"}"#;
        let body = |messages: &[&str]| {
            RequestBytes::from(Bytes::from(format!(
                r#"{{"model":"m","messages":[{}]}}"#,
                messages.join(",")
            )))
        };
        let named = |id: &str| Identity {
            id: id.into(),
            source: crate::proxy::identity::IdSource::HeadHash,
        };
        // Reads `next` after `last` (kept with `head`): the head identity it carries on.
        let carried = |last: &RequestBytes, head: Identity, next: &RequestBytes| {
            let first = cache
                .read_history(Dialect::OpenAiChat, last, false, None, None)
                .unwrap();
            let mut previous = first.request;
            previous.keep_transcript(first.transcript, Some(head), None);
            let second = cache
                .read_history(Dialect::OpenAiChat, next, false, Some(previous), None)
                .unwrap();
            second.head
        };
        let sys = r#"{"role":"system","content":"be brief"}"#;
        // A new turn after system + task: the same head.
        assert_eq!(
            carried(&body(&[sys, user]), named("a"), &body(&[sys, user, turn])),
            Some(named("a"))
        );
        // The task arrives only now: the head changed, so nothing is carried.
        assert_eq!(
            carried(&body(&[sys]), named("b"), &body(&[sys, user])),
            None
        );
        // Not a continuation (the first message changed): nothing is carried.
        let other = r#"{"role":"system","content":"be long"}"#;
        assert_eq!(
            carried(&body(&[sys, user]), named("c"), &body(&[other, user, turn])),
            None
        );
    }

    #[test]
    fn a_long_conversation_shares_its_items_and_continues_its_transcript_across_joins() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let head = Identity {
            id: "conv".into(),
            source: crate::proxy::identity::IdSource::HeadHash,
        };
        let body = |messages: &[String]| {
            RequestBytes::from(Bytes::from(format!(
                r#"{{"model":"m","messages":[{}]}}"#,
                messages.join(",")
            )))
        };
        let mut messages = vec![r#"{"role":"user","content":"the task"}"#.to_string()];
        let mut last: Option<LastRequest> = None;
        // Three times as many requests as a list keeps parts: several joins happen.
        for turn in 0..3 * MAX_PARTS {
            if turn == 2 * MAX_PARTS {
                // An earlier message edited (a client compacting its history): what
                // follows it is read again, and the transcript is built afresh.
                messages[1] = r#"{"role":"assistant","content":"edited"}"#.to_string();
            }
            messages.push(format!(r#"{{"role":"assistant","content":"step {turn}"}}"#));
            messages.push(format!(r#"{{"role":"user","content":"result {turn}"}}"#));
            let request = body(&messages);
            let earlier_items = last.as_ref().map(|p| p.read.items.clone());
            let read = cache
                .read_history(Dialect::OpenAiChat, &request, false, last.take(), None)
                .unwrap();
            let fresh = MessageCache::new(1 << 20, Duration::from_secs(60))
                .read_history(Dialect::OpenAiChat, &request, false, None, None)
                .unwrap();
            assert_eq!(read.transcript, fresh.transcript, "request {turn}");
            let items = &read.request.read.items;
            assert_eq!(items.len(), messages.len());
            assert!(items.parts.len() <= MAX_PARTS, "request {turn}");
            let edited = turn == 2 * MAX_PARTS;
            // A request that continues the last one carries its head identity on; one
            // after the edit does not.
            let continued = turn > 0 && !edited;
            assert_eq!(read.head.is_some(), continued, "request {turn}");
            if let Some(earlier) = earlier_items {
                // The messages both requests carry unchanged are the same parsed items.
                let same = if edited { 1 } else { earlier.len() };
                assert!(
                    (0..same).all(|i| Arc::ptr_eq(&items[i], &earlier[i])),
                    "request {turn}"
                );
                assert_eq!(items.starts_with_same(&earlier), !edited, "request {turn}");
            }
            let mut kept = read.request;
            kept.keep_transcript(read.transcript, Some(head.clone()), None);
            last = Some(kept);
        }
    }

    #[test]
    fn a_kept_fold_is_vouched_for_only_over_the_steps_the_new_messages_left_alone() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let body = |messages: &[&str]| {
            RequestBytes::from(Bytes::from(format!(
                r#"{{"model":"m","messages":[{}]}}"#,
                messages.join(",")
            )))
        };
        let call = |id: &str| {
            format!(
                r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"{id}","type":"function","function":{{"name":"bash","arguments":"{{}}"}}}}]}}"#
            )
        };
        let result =
            |id: &str| format!(r#"{{"role":"tool","tool_call_id":"{id}","content":"ok"}}"#);
        let task = r#"{"role":"user","content":"the task"}"#;
        let (c1, r1, c2, r2) = (call("c1"), result("c1"), call("c2"), result("c2"));
        let fold = Folded { fold: 7, steps: 2 };
        // Reads `next` after `last`, kept as decided by `fold`: what is vouched for.
        let vouched = |last: &[&str], next: &[&str]| {
            let first = cache
                .read_history(Dialect::OpenAiChat, &body(last), false, None, None)
                .unwrap();
            let mut previous = first.request;
            previous.keep_transcript(first.transcript, None, Some(fold));
            let second = cache
                .read_history(
                    Dialect::OpenAiChat,
                    &body(next),
                    false,
                    Some(previous),
                    None,
                )
                .unwrap();
            second.folded
        };
        // A new turn after two answered ones: both stay as they were.
        assert_eq!(
            vouched(
                &[task, &c1, &r1, &c2, &r2],
                &[task, &c1, &r1, &c2, &r2, &c1]
            ),
            Some(fold)
        );
        // The second turn's result arrives only now: the first step alone is vouched for.
        assert_eq!(
            vouched(&[task, &c1, &r1, &c2], &[task, &c1, &r1, &c2, &r2]),
            Some(fold.within(1))
        );
        // Not a continuation (another task): nothing is vouched for.
        let other = r#"{"role":"user","content":"another task"}"#;
        assert_eq!(vouched(&[task, &c1, &r1], &[other, &c1, &r1, &c2]), None);
    }

    #[test]
    fn a_body_is_read_after_what_it_was_compared_with_even_once_that_is_replaced() {
        let body = |turns: &[&str]| {
            let messages: Vec<String> = turns
                .iter()
                .map(|t| format!(r#"{{"role":"user","content":"{t}"}}"#))
                .collect();
            RequestBytes::from(Bytes::from(format!(
                r#"{{"model":"m","messages":[{}]}}"#,
                messages.join(",")
            )))
        };
        let last = body(&["sys", "task", "turn 1"]);
        let next = body(&["sys", "task", "turn 1", "turn 2"]);
        let fresh = MessageCache::new(1 << 20, Duration::from_secs(60))
            .read_history(Dialect::OpenAiChat, &next, false, None, None)
            .unwrap();
        // The request that finished while `next` arrived has the same history as `last`:
        // read after it with the same cache (the same parsed items, so its transcript is
        // continued) or on its own (other items: a transcript is built).
        for same_cache in [true, false] {
            let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
            let first = cache
                .read_history(Dialect::OpenAiChat, &last, false, None, None)
                .unwrap();
            let mut compared_with = first.request;
            compared_with.keep_transcript(first.transcript, None, None);
            let mut prefix = SharedPrefix::new(compared_with.scanned(Dialect::OpenAiChat).unwrap());
            let next_bytes = next.to_whole();
            let (a, b) = next_bytes.split_at(20);
            prefix.arrived(a);
            prefix.arrived(b);
            assert_eq!(prefix.equal(), last.len() - "]}".len());
            let compared = Compared {
                request: compared_with.share(),
                prefix,
            };
            let other = MessageCache::new(1 << 20, Duration::from_secs(60));
            let copy = RequestBytes::from(Bytes::copy_from_slice(&last.to_whole()));
            let finished = if same_cache {
                cache.read_history(
                    Dialect::OpenAiChat,
                    &copy,
                    false,
                    Some(compared_with.lend()),
                    None,
                )
            } else {
                other.read_history(Dialect::OpenAiChat, &copy, false, None, None)
            }
            .unwrap();
            let mut replaced_by = finished.request;
            replaced_by.keep_transcript(finished.transcript, None, None);

            let read = cache
                .read_history(
                    Dialect::OpenAiChat,
                    &next,
                    false,
                    Some(replaced_by.lend()),
                    Some(&compared),
                )
                .unwrap();
            assert_eq!(
                read.transcript, fresh.transcript,
                "same cache: {same_cache}"
            );
            let items = &read.request.read.items;
            assert_eq!(items.len(), 4);
            assert!(
                (0..3).all(|i| Arc::ptr_eq(&items[i], &compared.request.read.items[i])),
                "the unchanged messages are those of the request compared with"
            );
        }
    }

    #[test]
    fn unchanged_messages_of_the_previous_request_are_recognised_by_their_bytes() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let slices = |body: &Bytes| -> Vec<RawMessage<'static>> {
            // The test bodies are leaked so their slices can outlive this closure.
            let text: &'static str =
                Box::leak(String::from_utf8(body.to_vec()).unwrap().into_boxed_str());
            text.split('|').map(RawMessage::new).collect()
        };
        let first =
            Bytes::from_static(br#"{"role":"user","content":"a"}|{"role":"user","content":"b"}"#);
        let first_msgs: Vec<RawMessage> = std::str::from_utf8(&first)
            .unwrap()
            .split('|')
            .map(RawMessage::new)
            .collect();
        let items = cache.items(Dialect::OpenAiChat, &first_msgs, None, 0);
        let previous = LastRequest::new(
            Dialect::OpenAiChat,
            &RequestBytes::from(first.clone()),
            &first_msgs,
            items.clone(),
            None,
            None,
            Preamble::default(),
        );
        let parsed_before = cache.size().0;

        // Same two messages plus a new one, in a new body: the two are recognised without
        // a lookup (the same parsed items), only the third is new.
        let second = Bytes::from_static(
            br#"{"role":"user","content":"a"}|{"role":"user","content":"b"}|{"role":"user","content":"c"}"#,
        );
        let second_msgs = slices(&second);
        let again = cache.items(Dialect::OpenAiChat, &second_msgs, Some(&previous), 0);
        assert!(Arc::ptr_eq(&again[0], &items[0]) && Arc::ptr_eq(&again[1], &items[1]));
        assert_eq!(cache.size().0, parsed_before + 1);

        // Slices that are not part of the previous body are never taken for it.
        let foreign = LastRequest::new(
            Dialect::OpenAiChat,
            &RequestBytes::from(Bytes::from_static(b"x")),
            &first_msgs,
            items.clone(),
            None,
            None,
            Preamble::default(),
        );
        assert!(foreign
            .same(Dialect::OpenAiChat, 0, first_msgs[0].get())
            .is_none());
        // Another wire format never reuses the items.
        assert!(previous
            .same(Dialect::Anthropic, 0, first_msgs[0].get())
            .is_none());
        // A changed message at the same position is not the same message.
        assert!(previous
            .same(Dialect::OpenAiChat, 1, r#"{"role":"user","content":"B"}"#)
            .is_none());
    }

    #[test]
    fn the_system_prompt_is_the_last_request_s_while_its_bytes_are_the_same() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let request = |system: &str, turns: usize| {
            let messages: Vec<String> = (0..turns)
                .map(|i| format!(r#"{{"role":"user","content":"turn {i}"}}"#))
                .collect();
            RequestBytes::from(Bytes::from(format!(
                r#"{{"model":"m","system":[{{"type":"text","text":"{system}"}}],"messages":[{}]}}"#,
                messages.join(",")
            )))
        };
        let read = |body: &RequestBytes, last: Option<LastRequest>| {
            cache
                .read_history(Dialect::Anthropic, body, false, last, None)
                .unwrap()
                .request
        };
        let first = read(&request("be brief", 1), None);
        let items = first.read.preamble.items.clone();
        assert_eq!(
            &*items,
            &[Item::System {
                text: "be brief".into()
            }]
        );
        let next = read(&request("be brief", 2), Some(first.share()));
        assert!(
            Arc::ptr_eq(&next.read.preamble.items, &items),
            "the same bytes: reused"
        );
        let changed = read(&request("be thorough", 2), Some(first.share()));
        assert_eq!(
            &*changed.read.preamble.items,
            &[Item::System {
                text: "be thorough".into()
            }],
            "other bytes: read"
        );
        // No system member now: no preamble, whatever the last request had.
        let none = RequestBytes::from(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        ));
        assert!(read(&none, Some(first.share()))
            .read
            .preamble
            .items
            .is_empty());
    }
}
