//! The request body, read once off the socket as it arrives.
//!
//! While the body repeats its conversation's last body ([`BodyComparison`], which looks
//! the conversation up and compares each frame), the frames are not copied at all: the
//! body keeps the last body's bytes ([`RequestBytes`]).

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};

use super::large_buffer::LargeBuffer;
use crate::proxy::memory::BodyComparison;
use crate::request_bytes::RequestBytes;

/// Preallocated at most for a body that announces its length: a larger body grows.
const PRESIZE_MAX: usize = 8 << 20;

/// A body's own bytes, when announced at least this long, get a buffer of their own kind
/// ([`LargeBuffer`]: on huge pages, written past the CPU caches). So many bytes do not
/// stay in a 2 MiB L2 anyway, and are read back from memory by the next request of the
/// conversation. Fewer, which the scan and the upstream write then read from the cache, are
/// copied the ordinary way.
const LARGE_MIN: usize = 1 << 20;

/// Bytes found equal to the conversation's last body lie within it: `BodyComparison` compares no
/// further than its end. Were that ever broken, the request fails rather than panics.
const PAST_THE_LAST_BODY: &str = "internal: shared bytes past the last body";

/// A body that went `server.body_timeout_secs` without a byte: the client sent its head
/// and then its body too slowly, or stopped.
#[derive(Debug)]
pub struct BodyStalled;

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body stalled")
    }
}

impl std::error::Error for BodyStalled {}

/// Bytes a body must bring within each `idle` period to keep going (its last frame ends
/// it whatever its size): a trickle of a byte a second makes no progress.
const MIN_PROGRESS: usize = 1024;

/// `body`, failing with [`BodyStalled`] once `idle` passes without [`MIN_PROGRESS`] bytes
/// of it: a client that sends its head and then its body at a byte a second (or never)
/// would otherwise hold the connection, and a serving slot under the cap, for ever
/// (hyper's header timeout ends with the head).
pub fn with_idle_timeout(body: Body, idle: std::time::Duration) -> Body {
    Body::new(IdleTimeout {
        inner: body,
        idle,
        deadline: Box::pin(tokio::time::sleep(idle)),
        progress: 0,
    })
}

struct IdleTimeout {
    inner: Body,
    idle: std::time::Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Bytes since the deadline was last pushed back.
    progress: usize,
}

impl http_body::Body for IdleTimeout {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::BoxError>>> {
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(|f| f.data_ref())) {
                    this.progress += data.map_or(0, Bytes::len);
                }
                if this.progress >= MIN_PROGRESS {
                    this.progress = 0;
                    let next = tokio::time::Instant::now() + this.idle;
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(frame.map(|f| f.map_err(axum::BoxError::from)))
            }
            Poll::Pending => match std::future::Future::poll(this.deadline.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The request body, read as it arrives.
///
/// While the body repeats its conversation's last body byte for byte (a history, most of
/// a long request), its frames are only compared with it ([`BodyComparison`]), not copied: the
/// body's head is that body's bytes ([`RequestBytes`]). From the first difference on, the
/// frames are copied into a buffer of the body's own (sized from the announced length),
/// which starts at the last history message the two share
/// ([`crate::scan::Scanned::split_for`]), so that every message lies in one piece. A
/// body that differs before that, or that arrives before its conversation is known, is
/// copied whole, as one buffer; one that arrives as one frame is kept as it is.
///
/// Each frame is dropped once compared or copied, so that hyper reuses its read buffer:
/// collecting the frames and concatenating them held each body about twice per request in
/// flight.
pub async fn read_body(
    body: Body,
    limit: usize,
    earlier: &mut BodyComparison<'_>,
) -> Result<RequestBytes, axum::BoxError> {
    let announced = http_body::Body::size_hint(&body).exact();
    let capacity = announced.map_or(0, |n| (n as usize).min(limit).min(PRESIZE_MAX));
    let mut body = Limited::new(body, limit);
    // The body while it is a single frame.
    let mut single: Option<Bytes> = None;
    // The body's own bytes: all of it, or from `head.len()` on.
    let mut joined = Own::default();
    // While the body so far is the last body's bytes: that body, and how many (none of
    // them copied).
    let mut shared: Option<(RequestBytes, usize)> = None;
    // The last body's bytes the body starts with, once it differs after a shared message.
    let mut head = Bytes::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers: not part of what is forwarded as the body
        };
        if data.is_empty() {
            continue;
        }
        if let Some((old, upto)) = shared.take() {
            let equal = earlier.compare(&data);
            if equal == upto + data.len() {
                shared = Some((old, equal));
                continue;
            }
            // The head may end before this frame (the body's own bytes then start with the
            // last body's from there) or in it (they start inside the frame). `equal`, and
            // so the head's end, lie within the last body.
            head = old
                .head()
                .slice(..earlier.split_for(equal).min(old.head().len()));
            let from = head.len();
            joined.reserve(capacity.saturating_sub(from).max(upto + data.len() - from));
            if from <= upto {
                let (a, b) = old.slices(from..upto).ok_or(PAST_THE_LAST_BODY)?;
                joined.append(a);
                joined.append(b);
                joined.append(&data);
            } else {
                joined.append(&data[from - upto..]);
            }
            continue;
        }
        if single.is_none() && joined.is_empty() && head.is_empty() {
            earlier.arrived(&data, &data);
            match earlier.sharing(data.len()) {
                Some(old) => shared = Some((old, data.len())),
                None => single = Some(data),
            }
            continue;
        }
        if let Some(first) = single.take() {
            joined.reserve(capacity.max(first.len() + data.len()));
            joined.append(&first);
        }
        joined.append(&data);
        // The frame, not its copy, is compared: the copy may not be in the cache.
        earlier.arrived(joined.as_slice(), &data);
        if head.is_empty() {
            // Found only now, the conversation's last body may start with every byte so far:
            // its bytes are then the body's from here on.
            if let Some(old) = earlier.sharing(joined.len()) {
                shared = Some((old, joined.len()));
                joined = Own::default();
            }
        }
    }
    if let Some((old, upto)) = shared {
        if upto == old.len() {
            return Ok(old);
        }
        // A body that stops short of the last one (not JSON): its own copy.
        let (a, b) = old.slices(0..upto).ok_or(PAST_THE_LAST_BODY)?;
        return Ok(RequestBytes::from(Bytes::from([a, b].concat())));
    }
    Ok(match single {
        Some(single) => RequestBytes::from(single),
        None if head.is_empty() => RequestBytes::from(joined.freeze()),
        None => RequestBytes::split(head, joined.freeze()),
    })
}

/// A body's own bytes, copied in as they arrive.
enum Own {
    Ordinary(BytesMut),
    /// A large body's ([`LARGE_MIN`]).
    Large(LargeBuffer),
}

impl Default for Own {
    fn default() -> Own {
        Own::Ordinary(BytesMut::new())
    }
}

impl Own {
    /// Makes room for `additional` bytes more: a [`LargeBuffer`] when they are the first
    /// and at least [`LARGE_MIN`] (an ordinary buffer when none can be mapped).
    fn reserve(&mut self, additional: usize) {
        match self {
            Own::Ordinary(bytes) if bytes.is_empty() && additional >= LARGE_MIN => {
                match LargeBuffer::with_capacity(additional) {
                    Some(buffer) => *self = Own::Large(buffer),
                    None => bytes.reserve(additional),
                }
            }
            Own::Ordinary(bytes) => bytes.reserve(additional),
            // Grows as it is appended to.
            Own::Large(_) => {}
        }
    }

    fn append(&mut self, data: &[u8]) {
        match self {
            Own::Ordinary(bytes) => bytes.extend_from_slice(data),
            Own::Large(buffer) => {
                if buffer.append(data).is_none() {
                    // No larger mapping to move to: an ordinary buffer from here on.
                    let mut bytes = BytesMut::with_capacity(buffer.len() + data.len());
                    bytes.extend_from_slice(buffer.as_slice());
                    bytes.extend_from_slice(data);
                    *self = Own::Ordinary(bytes);
                }
            }
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Own::Ordinary(bytes) => bytes,
            Own::Large(buffer) => buffer.as_slice(),
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn freeze(self) -> Bytes {
        match self {
            Own::Ordinary(bytes) => bytes.freeze(),
            Own::Large(buffer) => buffer.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;
    use crate::config::CacheConfig;
    use crate::dialect::Dialect;
    use crate::proxy::identity;
    use crate::proxy::memory::{head_key, LastRequest, Memory, Predecessor};

    /// Bodies over this share of the last body's length in its tail are joined
    /// (`memory::arrival`'s `TAIL_SHARE_MAX`).
    const TAIL_SHARE_MAX: usize = 16;

    fn memory() -> Memory {
        Memory::new(&CacheConfig::default())
    }

    /// A body that arrives in the given frames.
    fn framed(parts: Vec<Bytes>) -> Body {
        let frames = parts
            .into_iter()
            .map(|p| Ok::<_, std::convert::Infallible>(http_body::Frame::data(p)));
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames.collect::<Vec<_>>(),
        )))
    }

    /// A body that announces its length (as a request with `content-length` does) and
    /// arrives in the given frames.
    fn announced(parts: Vec<Bytes>) -> Body {
        struct Announced(std::collections::VecDeque<Bytes>, u64);
        impl http_body::Body for Announced {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
                let next = self.0.pop_front();
                if let Some(frame) = &next {
                    self.1 -= frame.len() as u64;
                }
                std::task::Poll::Ready(next.map(|b| Ok(http_body::Frame::data(b))))
            }
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::SizeHint::with_exact(self.1)
            }
        }
        let len = parts.iter().map(|p| p.len() as u64).sum();
        Body::new(Announced(parts.into(), len))
    }

    fn pieces(body: &str, size: usize) -> Vec<Bytes> {
        body.as_bytes()
            .chunks(size)
            .map(Bytes::copy_from_slice)
            .collect()
    }

    fn whole(text: &str) -> RequestBytes {
        RequestBytes::from(Bytes::from(text.to_string()))
    }

    fn chat(texts: &[&str]) -> String {
        let messages: Vec<String> = texts
            .iter()
            .map(|t| format!(r#"{{"role":"user","content":"{t}"}}"#))
            .collect();
        format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_order_whatever_its_frames() {
        let conversations = memory();
        for parts in [
            &[][..],
            &["{}"][..],
            &["", "{\"a\":", "", "1}"][..],
            &["{", "\"b\"", ":", "[1,2]", "}"][..],
        ] {
            let frames = parts.iter().map(|p| Bytes::from_static(p.as_bytes()));
            let mut earlier = BodyComparison::new(&conversations, None, None);
            let body = read_body(framed(frames.collect()), 1024, &mut earlier)
                .await
                .unwrap();
            assert_eq!(body.to_whole(), parts.concat().as_bytes(), "{parts:?}");
        }
        let mut earlier = BodyComparison::new(&conversations, None, None);
        let refused = read_body(framed(pieces("01234567890123456789", 10)), 15, &mut earlier).await;
        let error = refused.expect_err("over the limit");
        assert!(error.is::<http_body_util::LengthLimitError>(), "{error}");
    }

    #[tokio::test]
    async fn a_large_announced_body_is_read_whole_and_compared_as_it_arrives() {
        // Over `LARGE_MIN`, in frames of an odd size, after a kept request that
        // shares all of its history.
        let turns: Vec<String> = (0..600)
            .map(|i| format!("turn {i} {}", "x".repeat(2000)))
            .collect();
        let texts: Vec<&str> = turns.iter().map(String::as_str).collect();
        let last = chat(&texts[..599]);
        let next = chat(&texts);
        assert!(next.len() > LARGE_MIN);
        let conversations = memory();
        keep_last(&conversations, "conv-big", &last);
        let mut earlier =
            BodyComparison::new(&conversations, Some(Dialect::OpenAiChat), Some("conv-big"));
        let read = read_body(announced(pieces(&next, 65_537)), 8 << 20, &mut earlier)
            .await
            .unwrap();
        assert!(
            read.to_whole() == next.as_bytes(),
            "the body's bytes, in order"
        );
        let found = earlier.finish(&read).unwrap();
        let compared = found.compared.expect("compared while it arrived");
        assert_eq!(compared.prefix.equal(), last.len() - "]}".len());

        // With nothing to compare it with, it is copied whole into a large buffer (mapped
        // on a huge page's boundary), past the caches.
        let mut earlier =
            BodyComparison::new(&conversations, Some(Dialect::OpenAiChat), Some("other"));
        let read = read_body(announced(pieces(&next, 65_537)), 8 << 20, &mut earlier)
            .await
            .unwrap();
        let whole = read.whole().expect("one piece");
        assert!(whole == next.as_bytes(), "the body's bytes, in order");
        if cfg!(target_os = "linux") {
            assert_eq!(whole.as_ptr() as usize % (2 << 20), 0, "a large buffer's");
        }
    }

    #[tokio::test]
    async fn a_body_that_repeats_the_last_one_shares_its_bytes_and_copies_only_its_own() {
        let conversations = memory();

        // Reads `text` as the proxy does, checks it reads as from scratch, and keeps it as
        // the conversation's last request.
        let send = |text: String| {
            let conversations = &conversations;
            async move {
                let mut earlier =
                    BodyComparison::new(conversations, Some(Dialect::OpenAiChat), Some("c"));
                let read = read_body(announced(pieces(&text, 4096)), 1 << 20, &mut earlier)
                    .await
                    .unwrap();
                assert!(read == *text.as_bytes(), "its bytes");
                let found = earlier.finish(&read).unwrap();
                let history = conversations
                    .messages
                    .read_history(
                        Dialect::OpenAiChat,
                        &read,
                        false,
                        found.recalled.last,
                        found.compared.as_ref(),
                    )
                    .unwrap();
                let fresh = memory()
                    .messages
                    .read_history(Dialect::OpenAiChat, &whole(&text), false, None, None)
                    .unwrap();
                assert_eq!(history.transcript, fresh.transcript);
                let mut previous = history.request;
                previous.keep_transcript(history.transcript, None, None);
                conversations.put(found.recall, previous, None, 0);
                read
            }
        };
        let turns: Vec<String> = (0..48)
            .map(|i| format!("turn {i} {}", "x".repeat(3000)))
            .collect();
        let texts: Vec<&str> = turns.iter().map(String::as_str).collect();
        let (mut split, mut joined, mut repeated) = (0, 0, false);
        let mut last = send(chat(&texts[..3])).await;
        for n in 4..48 {
            let text = chat(&texts[..n]);
            let read = send(text.clone()).await;
            if last.tail().len() <= last.len() / TAIL_SHARE_MAX {
                // The last body's buffer up to a message both share, and its own bytes.
                assert_eq!(read.head().as_ptr(), last.head().as_ptr(), "request {n}");
                let added = text.len() - last.len();
                assert!(read.tail().len() <= last.tail().len() + added + 3100);
                split += 1;
            } else {
                assert!(read.whole().is_some(), "request {n}: a long tail is joined");
                joined += 1;
            }
            if !repeated && n > 10 && read.tail().len() <= read.len() / TAIL_SHARE_MAX {
                // The same body again, as a client's retry sends it: the last one's buffers.
                let again = send(text).await;
                assert!(again.same_buffers(&read));
                repeated = true;
            }
            last = read;
        }
        assert!(
            split > 20 && joined > 0 && repeated,
            "{split} split, {joined} joined"
        );
    }

    /// The conversation's last request, kept under `key` as the proxy keeps it.
    fn keep_last(conversations: &Memory, key: &str, body: &str) {
        let body = RequestBytes::from(Bytes::from(body.to_string()));
        let history = conversations
            .messages
            .read_history(Dialect::OpenAiChat, &body, false, None, None)
            .unwrap();
        conversations.put(conversations.recall(key), history.request, None, 0);
    }

    /// Reads `body`, arriving in pieces of `size` bytes, as the proxy does for a chat
    /// request (with the stated id `stated`), and says what was found for it.
    async fn arrive(
        conversations: &Memory,
        stated: Option<&str>,
        body: &str,
        size: usize,
    ) -> Predecessor {
        let mut earlier = BodyComparison::new(conversations, Some(Dialect::OpenAiChat), stated);
        let read = read_body(framed(pieces(body, size)), 1 << 20, &mut earlier)
            .await
            .unwrap();
        assert_eq!(read.to_whole(), body.as_bytes());
        earlier.finish(&read).unwrap()
    }

    #[tokio::test]
    async fn the_last_request_is_found_while_the_body_arrives_and_compared_frame_by_frame() {
        let conversations = memory();
        let last = chat(&["sys", "task", "turn 1"]);
        let next = chat(&["sys", "task", "turn 1", "turn 2"]);
        // Everything up to the end of the last request's history is shared.
        let shared = last.len() - "]}".len();
        assert_eq!(next.as_bytes()[..shared], last.as_bytes()[..shared]);

        // No stated id: found by the first two messages, once their bytes are in (the
        // frames are 7 bytes; the key needs ~70).
        keep_last(
            &conversations,
            &head_key(Dialect::OpenAiChat, last.as_bytes()),
            &last,
        );
        let found = arrive(&conversations, None, &next, 7).await;
        let slot = |key: &str| conversations.recall(key);
        assert!(found
            .recall
            .is_slot_of(&slot(&head_key(Dialect::OpenAiChat, next.as_bytes()))));
        assert!(found.recalled.last.is_some());
        let compared = found.compared.expect("compared while it arrived");
        assert_eq!(compared.prefix.equal(), shared);

        // A stated id: looked up before the first byte.
        keep_last(&conversations, "conv-1", &last);
        let found = arrive(&conversations, Some("conv-1"), &last, 5).await;
        assert!(found.recall.is_slot_of(&slot("conv-1")));
        assert_eq!(found.compared.expect("compared").prefix.equal(), last.len());

        // One message: no key until the whole body is in; then looked up, not compared yet.
        let one = chat(&["only"]);
        keep_last(
            &conversations,
            &head_key(Dialect::OpenAiChat, one.as_bytes()),
            &one,
        );
        let found = arrive(&conversations, None, &one, 4).await;
        assert!(found.recalled.last.is_some() && found.compared.is_none());

        // An unknown conversation: nothing found, the key is still the head key.
        let other = chat(&["sys", "another task"]);
        let found = arrive(&conversations, None, &other, 9).await;
        assert!(found.recalled.last.is_none() && found.compared.is_none());
        assert!(found
            .recall
            .is_slot_of(&slot(&head_key(Dialect::OpenAiChat, other.as_bytes()))));

        // A route without a conversation looks nothing up.
        let earlier = BodyComparison::new(&conversations, None, Some("conv-1"));
        assert!(earlier.finish(&whole(&last)).is_none());
    }

    #[tokio::test]
    async fn what_a_body_was_compared_with_outlives_its_replacement_while_the_body_arrives() {
        let conversations = memory();
        let last = chat(&["sys", "task", "turn 1"]);
        let next = chat(&["sys", "task", "turn 1", "turn 2"]);
        let scanned_body = |p: &LastRequest| {
            p.scanned(Dialect::OpenAiChat)
                .unwrap()
                .body()
                .head()
                .clone()
        };
        keep_last(&conversations, "conv-1", &last);
        let kept = scanned_body(&conversations.recall("conv-1").peek().unwrap());

        let mut earlier =
            BodyComparison::new(&conversations, Some(Dialect::OpenAiChat), Some("conv-1"));
        let (a, _) = next.as_bytes().split_at(30);
        earlier.arrived(a, a);
        // Another request of the conversation finishes meanwhile: it is the last one now.
        keep_last(&conversations, "conv-1", &last);
        let replacing = scanned_body(&conversations.recall("conv-1").peek().unwrap());
        assert_ne!(replacing.as_ptr(), kept.as_ptr());
        earlier.arrived(next.as_bytes(), &next.as_bytes()[a.len()..]);

        let found = earlier.finish(&whole(&next)).unwrap();
        let compared = found.compared.expect("compared while it arrived");
        assert_eq!(scanned_body(&compared.request).as_ptr(), kept.as_ptr());
        assert_eq!(compared.prefix.equal(), last.len() - "]}".len());
        let previous = found.recalled.last.expect("the last request");
        assert_eq!(scanned_body(&previous).as_ptr(), replacing.as_ptr());
    }

    #[test]
    fn head_keys_follow_the_first_two_messages_and_never_look_like_ids() {
        let a = head_key(
            Dialect::OpenAiChat,
            chat(&["sys", "task", "turn 1"]).as_bytes(),
        );
        assert_eq!(
            a,
            head_key(
                Dialect::OpenAiChat,
                chat(&["sys", "task", "turn 1", "turn 2"]).as_bytes()
            )
        );
        assert_eq!(
            a,
            head_key(Dialect::OpenAiChat, chat(&["sys", "task"]).as_bytes())
        );
        assert_ne!(
            a,
            head_key(Dialect::OpenAiChat, chat(&["sys", "other task"]).as_bytes())
        );
        assert_ne!(a, head_key(Dialect::OpenAiChat, chat(&["sys"]).as_bytes()));
        assert_ne!(
            a,
            head_key(Dialect::Anthropic, chat(&["sys", "task"]).as_bytes())
        );
        let plain_id = |id: &str| identity::stated(&HeaderMap::new(), Some(id)).map(|i| i.id);
        assert_ne!(
            plain_id(&a),
            Some(a.clone()),
            "a head key is never a conversation id"
        );
    }
}
