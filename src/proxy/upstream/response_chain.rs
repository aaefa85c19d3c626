//! The Responses answers the proxy relayed, by response id, so that a request that names
//! its history by `previous_response_id` (and sends only the new input items) can be read
//! whole: Codex's WebSocket frames ([`crate::proxy::forward::websocket`]), and clients that let the API
//! store responses.
//!
//! Each answer is a [`Link`]: the input items its request added, then the output items it
//! gave, and the link of the response its request continued. A history is the chain of
//! links from the first request on, so consecutive answers share their past instead of each
//! holding a copy of it. Memory is bounded: the bytes of every link still alive are counted,
//! and the oldest answers are forgotten past the cap (a request that names one of them is
//! then read from what it sends, and the log says the link is missing).
//!
//! Over HTTP the answers are kept in the store as well ([`crate::store::runs`]; queued for
//! the log's writer, a row per answer): a request that continues an answer this process
//! never relayed (another replica did, or this one before a restart) is read with the
//! history the store keeps of it ([`read_http_or_stored`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::dialect::responses_socket::{self as wire, Create};
use crate::request_bytes::RequestBytes;
use crate::store::runs::{RunRecord, StoredAnswer};
use crate::store::{Store, StoreOptions};

/// How long a request waits for the store's answer on a miss, at most.
const STORE_WAIT: Duration = Duration::from_millis(250);
/// An answer another replica relayed a moment ago may still be in its log's queue (the
/// writer gathers for [`StoreOptions::BATCH_WINDOW`]): a chain not found is asked for once
/// more after this.
const STORE_AGAIN: Duration =
    Duration::from_millis(2 * StoreOptions::BATCH_WINDOW.as_millis() as u64);

/// Answers the proxy keeps for requests over HTTP, and the bytes of their links at most.
pub const HTTP_ANSWERS: usize = 4096;
pub const HTTP_MAX_BYTES: usize = 64 << 20;

/// One answer and the input that asked for it.
pub struct Link {
    parent: Option<Arc<Link>>,
    /// The request's own input items, then the answer's output items.
    items: Vec<Box<RawValue>>,
    /// loopwarden wrote this answer (a halt): the upstream never saw it, so a request that
    /// continues it must resend its history whole.
    pub made_here: bool,
    bytes: usize,
    live: Arc<AtomicUsize>,
}

impl Link {
    /// The whole history up to and including this answer, oldest item first.
    pub fn history(&self) -> Vec<&RawValue> {
        let mut links = Vec::new();
        let mut link = Some(self);
        while let Some(l) = link {
            links.push(l);
            link = l.parent.as_deref();
        }
        links
            .iter()
            .rev()
            .flat_map(|l| l.items.iter().map(|i| &**i))
            .collect()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.live.fetch_sub(self.bytes, Ordering::Relaxed);
        // A long chain is dropped link by link, not by recursion (its depth is the number
        // of turns).
        let mut parent = self.parent.take();
        while let Some(link) = parent {
            parent = match Arc::try_unwrap(link) {
                Ok(mut alone) => alone.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// What a `previous_response_id` leads to.
pub enum Found {
    /// The request names no earlier response.
    Start,
    Known(Arc<Link>),
    /// A response the proxy never saw, or forgot.
    Missing,
}

/// The answers remembered, oldest first in `order`.
pub struct ResponseChain {
    inner: Mutex<Inner>,
    max_bytes: usize,
    max_answers: usize,
    /// Bytes of every link alive (kept alive by the map or by a later link).
    live: Arc<AtomicUsize>,
    /// Where answers are kept for other processes ([`ResponseChain::keep_in`]); none:
    /// memory only (a WebSocket connection's chain, the mock's).
    store: OnceLock<Store>,
}

#[derive(Default)]
struct Inner {
    links: HashMap<String, Arc<Link>>,
    order: VecDeque<String>,
}

impl ResponseChain {
    pub fn new(max_answers: usize, max_bytes: usize) -> ResponseChain {
        ResponseChain {
            inner: Mutex::new(Inner::default()),
            max_bytes,
            max_answers,
            live: Arc::new(AtomicUsize::new(0)),
            store: OnceLock::new(),
        }
    }

    /// Keeps answers in `store` too, from now on, and looks them up there on a miss.
    pub fn keep_in(&self, store: Store) {
        let _ = self.store.set(store);
    }

    /// Brings answer `id` and the answers it continues from the store into memory;
    /// whether it was found there. Waits [`STORE_WAIT`] at most for each read.
    pub async fn recall_stored(&self, id: &str) -> bool {
        let Some(store) = self.store.get() else {
            return false;
        };
        let read = || tokio::time::timeout(STORE_WAIT, store.stored_chain(id));
        let mut found = read().await;
        if matches!(&found, Ok(Ok(chain)) if chain.is_empty()) {
            tokio::time::sleep(STORE_AGAIN).await;
            found = read().await;
        }
        let chain = match found {
            Ok(Ok(chain)) => chain,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read stored answers: the request is read from its own input");
                return false;
            }
            Err(_) => {
                tracing::warn!(
                    "the store did not answer in time: the request is read from its own input"
                );
                return false;
            }
        };
        // Oldest first, each continuing the one before.
        let mut parent: Option<Arc<Link>> = None;
        for answer in chain.into_iter().rev() {
            let Ok(items) = serde_json::from_str::<Vec<Box<RawValue>>>(&answer.items) else {
                tracing::warn!(response = %answer.id, "a stored answer's items are unreadable");
                return false;
            };
            self.remember(
                answer.id.clone(),
                parent.take(),
                items,
                Vec::new(),
                answer.made_here,
            );
            parent = match self.find(Some(&answer.id)) {
                Found::Known(link) => Some(link),
                _ => None,
            };
        }
        parent.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while holding it; a poisoned map is still a consistent one.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer `previous_response_id` names.
    pub fn find(&self, previous_response_id: Option<&str>) -> Found {
        let Some(id) = previous_response_id else {
            return Found::Start;
        };
        match self.lock().links.get(id) {
            Some(link) => Found::Known(link.clone()),
            None => Found::Missing,
        }
    }

    /// Remembers answer `id`: it continued `parent`, its request added `items`, and it gave
    /// `output`. The oldest answers are forgotten while the links alive exceed the caps.
    pub fn remember(
        &self,
        id: String,
        parent: Option<Arc<Link>>,
        mut items: Vec<Box<RawValue>>,
        output: Vec<Box<RawValue>>,
        made_here: bool,
    ) {
        items.extend(output);
        let bytes = items.iter().map(|i| i.get().len()).sum::<usize>();
        self.live.fetch_add(bytes, Ordering::Relaxed);
        let link = Arc::new(Link {
            parent,
            items,
            made_here,
            bytes,
            live: self.live.clone(),
        });
        let mut inner = self.lock();
        if inner.links.insert(id.clone(), link).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > self.max_answers
            || (self.live.load(Ordering::Relaxed) > self.max_bytes && !inner.order.is_empty())
        {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.links.remove(&oldest);
        }
    }

    /// Bytes of the links alive (tests).
    pub fn bytes(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

/// Says (in the process log, and as the request's `parse_error`) that a request continues
/// answer `id`, which the proxy never relayed or forgot: it was read from its own input.
pub fn missing(id: &str) -> crate::store::Masked {
    crate::warn_per_request!(previous_response_id = %id, "request continues a response loopwarden never relayed; read from its own input");
    crate::store::redact::summary(
        &format!("previous_response_id {id} unknown: read from the request's own input"),
        200,
    )
}

/// A Responses request over HTTP, as the chain reads it: what it continues, and the whole
/// request it stands for when that is more than its own body.
pub struct HttpRequest {
    create: Create,
    parent: Option<Arc<Link>>,
    history_len: usize,
    /// The request with its history before its own input, for the analysis; `None` when it
    /// continues no known answer (its own body is then all there is to read).
    pub whole: Option<RequestBytes>,
    /// The `previous_response_id` it names that the proxy never relayed (or forgot).
    pub missing: Option<String>,
}

/// [`read_http`], and when the request continues an answer this process does not hold,
/// again once that answer's chain is brought from the store (another replica relayed it,
/// or this process before a restart).
pub async fn read_http_or_stored(
    chain: &ResponseChain,
    body: &RequestBytes,
) -> Option<HttpRequest> {
    let read = read_http(chain, body)?;
    match &read.missing {
        Some(id) if chain.recall_stored(id).await => read_http(chain, body),
        _ => Some(read),
    }
}

/// Reads a Responses request `body` for the chain: `None` when it neither continues an
/// answer nor asks the API to keep its own (Codex over HTTP sends `store: false` and its
/// whole history: nothing to do, and its body is not parsed again).
pub fn read_http(chain: &ResponseChain, body: &RequestBytes) -> Option<HttpRequest> {
    // A top-level member lies in one piece of the body: each is searched, none copied.
    let found = |pattern: &[u8]| {
        [body.head(), body.tail()]
            .iter()
            .any(|piece| memchr::memmem::find(piece, pattern).is_some())
    };
    let continues = found(b"\"previous_response_id\"");
    if !continues && (found(b"\"store\":false") || found(b"\"store\": false")) {
        return None;
    }
    let create = wire::read_request(&body.to_whole())?;
    let (parent, missing) = match chain.find(create.previous_response_id.as_deref()) {
        Found::Start => (None, None),
        Found::Known(link) => (Some(link), None),
        Found::Missing => (None, create.previous_response_id.clone()),
    };
    let (whole, history_len) = match &parent {
        Some(link) => {
            let history = link.history();
            let body = create.http_body(&history);
            (Some(RequestBytes::from(Bytes::from(body))), history.len())
        }
        None => (None, 0),
    };
    Some(HttpRequest {
        create,
        parent,
        history_len,
        whole,
        missing,
    })
}

impl HttpRequest {
    /// The body to send for `rewritten`, a rewrite of [`HttpRequest::whole`]: the client's
    /// request with the items the rewrite added after its own input, or the rewritten
    /// history whole. `None`: the rewrite cannot be carried over.
    pub fn rewritten(&self, rewritten: &[u8]) -> Option<Vec<u8>> {
        self.create
            .rewritten(self.history_len, rewritten, false)
            .map(String::into_bytes)
    }

    /// What to remember of this request once its answer has come, when the API keeps it.
    pub fn pending(self, chain: &Arc<ResponseChain>) -> Option<Box<PendingAnswer>> {
        self.create.stored().then(|| {
            let parent_id = self.parent.as_ref().and(self.create.previous_response_id);
            Box::new(PendingAnswer {
                chain: chain.clone(),
                parent: self.parent,
                parent_id,
                input: self.create.input,
            })
        })
    }
}

/// A request whose answer is to be remembered when it ends whole.
pub struct PendingAnswer {
    chain: Arc<ResponseChain>,
    parent: Option<Arc<Link>>,
    /// The id of the answer `parent` is.
    parent_id: Option<String>,
    input: Vec<Box<RawValue>>,
}

impl PendingAnswer {
    /// The answer, as the tee captured it: an event stream or one JSON body. Remembered,
    /// and queued for the store.
    pub fn answered(self, event_stream: bool, chunks: &[Bytes]) {
        let Some((id, output)) = wire::answer_of(event_stream, chunks) else {
            return;
        };
        if let Some(store) = self.chain.store.get() {
            let items = self.input.iter().chain(&output).map(|i| i.get());
            store.log_run(RunRecord::Answer(StoredAnswer {
                id: id.clone(),
                parent_id: self.parent_id,
                items: json_array(items),
                made_here: false,
                stored_ms: crate::store::now_ms(),
            }));
        }
        self.chain
            .remember(id, self.parent, self.input, output, false);
    }
}

/// JSON items as one JSON array.
fn json_array<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(texts: &[&str]) -> Vec<Box<RawValue>> {
        texts
            .iter()
            .map(|t| RawValue::from_string(format!("\"{t}\"")).unwrap())
            .collect()
    }

    fn history(chain: &ResponseChain, id: &str) -> Option<Vec<String>> {
        match chain.find(Some(id)) {
            Found::Known(link) => {
                Some(link.history().iter().map(|r| r.get().to_string()).collect())
            }
            _ => None,
        }
    }

    #[test]
    fn a_history_is_its_chain_of_inputs_and_outputs() {
        let chain = ResponseChain::new(10, 1 << 20);
        chain.remember("r1".into(), None, items(&["u1"]), items(&["a1"]), false);
        let Found::Known(r1) = chain.find(Some("r1")) else {
            panic!("r1 is known")
        };
        chain.remember("r2".into(), Some(r1), items(&["t1"]), items(&["a2"]), false);
        assert_eq!(
            history(&chain, "r2").unwrap(),
            ["\"u1\"", "\"a1\"", "\"t1\"", "\"a2\""]
        );
        assert!(matches!(chain.find(None), Found::Start));
        assert!(matches!(chain.find(Some("r9")), Found::Missing));
    }

    #[test]
    fn the_oldest_answers_go_past_the_caps_and_their_bytes_with_them() {
        let chain = ResponseChain::new(2, 1 << 20);
        for id in ["a", "b", "c"] {
            chain.remember(id.into(), None, items(&["xxxx"]), Vec::new(), false);
        }
        assert!(history(&chain, "a").is_none());
        assert!(history(&chain, "c").is_some());
        assert_eq!(chain.bytes(), 2 * 6);
        // A link kept alive by a later one still counts, and goes when the later one goes.
        let chain = ResponseChain::new(100, 20);
        chain.remember("p".into(), None, items(&["0123456789"]), Vec::new(), false);
        let Found::Known(p) = chain.find(Some("p")) else {
            panic!("p is known")
        };
        chain.remember("q".into(), Some(p), items(&["x"]), Vec::new(), false);
        assert_eq!(chain.bytes(), 12 + 3);
        chain.remember("r".into(), None, items(&["0123456789"]), Vec::new(), false);
        assert!(chain.bytes() <= 20, "{}", chain.bytes());
        assert!(history(&chain, "r").is_some());
    }

    #[test]
    fn a_long_chain_drops_without_recursion() {
        let chain = ResponseChain::new(1, usize::MAX);
        let mut parent = None;
        for i in 0..200_000 {
            chain.remember(format!("r{i}"), parent, items(&["x"]), Vec::new(), false);
            parent = match chain.find(Some(&format!("r{i}"))) {
                Found::Known(link) => Some(link),
                _ => None,
            };
        }
        drop(parent);
        chain.remember("last".into(), None, Vec::new(), Vec::new(), false);
        assert_eq!(chain.bytes(), 0);
    }
}
