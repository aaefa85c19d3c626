//! Parsed messages, cached by the blake3 hash of their raw bytes.
//!
//! Every request carries the whole history, so without a cache the proxy would parse the
//! same messages again on every turn. Here each message is parsed once; later requests
//! only hash it and find its items. The key is the content (plus the wire format), not the
//! conversation: the result of parsing depends on the bytes alone, so the cache can never
//! make two conversations see different transcripts, and identity mistakes cannot hurt it.
//!
//! Bounded two ways: a message no request carried for `idle` is dropped by [`sweep`], and
//! when the raw bytes held exceed `max_bytes` the least recently used quarter goes.
//!
//! [`sweep`]: MessageCache::sweep

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dialect::{Dialect, RawMessage};
use crate::transcript::Item;

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

    /// The items of each message, in order, parsing only the messages not cached. The
    /// lock is held only for lookups and inserts, never while parsing.
    pub fn items(&self, dialect: Dialect, messages: &[RawMessage]) -> Vec<Items> {
        let keys: Vec<blake3::Hash> = messages
            .iter()
            .map(|raw| {
                let mut h = blake3::Hasher::new();
                h.update(&[dialect as u8]);
                h.update(raw.get().as_bytes());
                h.finalize()
            })
            .collect();
        let now = Instant::now();
        let mut found: Vec<Option<Items>> = {
            let mut inner = self.lock();
            keys.iter()
                .map(|k| {
                    inner.map.get_mut(k).map(|e| {
                        e.last_used = now;
                        e.items.clone()
                    })
                })
                .collect()
        };
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
                let bytes = messages[i].get().len();
                let entry = Entry {
                    items,
                    bytes,
                    last_used: now,
                };
                if let Some(old) = inner.map.insert(keys[i], entry) {
                    inner.bytes -= old.bytes;
                }
                inner.bytes += bytes;
            }
            if inner.bytes > self.max_bytes {
                evict_oldest_quarter(&mut inner);
            }
        }
        found.into_iter().flatten().collect()
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves a consistent map: keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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
    use super::*;
    use serde_json::value::RawValue;

    fn raws(texts: &[&str]) -> Vec<Box<RawValue>> {
        texts
            .iter()
            .map(|t| RawValue::from_string(t.to_string()).unwrap())
            .collect()
    }

    #[test]
    fn known_messages_come_from_the_cache() {
        let cache = MessageCache::new(1 << 20, Duration::from_secs(60));
        let owned = raws(&[
            r#"{"role":"user","content":"a"}"#,
            r#"{"role":"user","content":"b"}"#,
        ]);
        let msgs: Vec<RawMessage> = owned.iter().map(|b| RawMessage::new(b.get())).collect();
        let first = cache.items(Dialect::OpenAiChat, &msgs);
        assert_eq!(cache.size().0, 2);
        let again = cache.items(Dialect::OpenAiChat, &msgs);
        assert!(
            Arc::ptr_eq(&first[0], &again[0]),
            "second lookup reuses the parsed items"
        );
        // Same bytes under another wire format are another message.
        cache.items(Dialect::Anthropic, &msgs[..1]);
        assert_eq!(cache.size().0, 3);
    }

    #[test]
    fn budget_and_idle_time_bound_the_cache() {
        let cache = MessageCache::new(100, Duration::from_secs(3600));
        let texts: Vec<String> = (0..20).map(|i| format!(r#"{{"n":"{i:010}"}}"#)).collect();
        let owned = raws(&texts.iter().map(String::as_str).collect::<Vec<_>>());
        for raw in &owned {
            cache.items(Dialect::OpenAiChat, &[RawMessage::new(raw.get())]);
        }
        assert!(cache.size().1 <= 100, "{:?}", cache.size());

        let cache = MessageCache::new(1 << 20, Duration::ZERO);
        cache.items(Dialect::OpenAiChat, &[RawMessage::new(owned[0].get())]);
        std::thread::sleep(Duration::from_millis(2));
        cache.sweep();
        assert_eq!(cache.size(), (0, 0));
    }
}
