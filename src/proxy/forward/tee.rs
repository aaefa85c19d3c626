//! The response body the client receives: the upstream's body, frame by frame as it
//! arrives, with a copy of each data frame kept for the log (a reference-counted
//! `Bytes` clone, no byte copy) and the request's log entry completed when the body ends.
//!
//! Nothing here waits or buffers: a frame is handed on in the same poll that received it.
//! How the body ends is the request's outcome: the upstream finished it (`complete`), it
//! failed mid-way (`upstream_broken`, or `upstream_stalled` when it went silent for
//! `upstream.stream_idle_secs`, and the client sees the same break), or the client
//! went away first (`client_disconnected`: the body is dropped, which drops the upstream
//! response and closes that connection, so the upstream stops generating), or the stop's
//! grace period ended first (`cut_at_shutdown`: the connection is dropped, the same way).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::record::{Capture, Finished, Outcome};
use crate::budget::Ledger;
use crate::proxy::upstream::BodyError;
use crate::store::Store;

/// Responses larger than this are forwarded whole but not decoded for the log.
const MAX_CAPTURE_BYTES: usize = 16 * 1024 * 1024;

/// `B` is the upstream's body, or that body behind the block check.
pub struct TeeBody<B: Body = Incoming> {
    inner: B,
    pending: Option<Box<Pending>>,
}

/// Where a finished request goes: the log's queue, and the ledger its answer is charged to.
#[derive(Clone)]
pub struct Sinks {
    pub store: Store,
    pub ledger: Ledger,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub traces: std::sync::Arc<crate::telemetry::Traces>,
    /// The end of a stop's grace period, which tells a cut answer from a client leaving.
    pub cut: crate::proxy::serve::Cut,
}

impl Sinks {
    pub fn of(app: &super::app::App) -> Sinks {
        Sinks {
            store: app.store.clone(),
            ledger: app.ledger.clone(),
            metrics: app.metrics.clone(),
            traces: app.traces.clone(),
            cut: app.cut.clone(),
        }
    }
}

/// The log entry of a request whose response is still flowing.
pub struct Pending {
    pub finished: Box<Finished>,
    pub sinks: Sinks,
    /// When the request was sent upstream, for the upstream's total time.
    pub sent: Instant,
    /// Response bytes kept for decoding; `None` when not wanted or over the limit.
    pub capture: Option<Capture>,
    /// Set when the block check replaced a call in this answer: the decision to log.
    pub blocked: Option<Blocked>,
    captured_bytes: usize,
    response_bytes: u64,
}

/// Where the block check leaves its decision for the log.
pub type Blocked = std::sync::Arc<std::sync::OnceLock<crate::detect::Decision>>;

impl Pending {
    pub fn new(
        finished: Box<Finished>,
        sinks: Sinks,
        sent: Instant,
        capture: Option<Capture>,
    ) -> Pending {
        Pending {
            finished,
            sinks,
            sent,
            capture,
            blocked: None,
            captured_bytes: 0,
            response_bytes: 0,
        }
    }
}

impl<B: Body> TeeBody<B> {
    pub fn new(inner: B, pending: Pending) -> TeeBody<B> {
        TeeBody {
            inner,
            pending: Some(Box::new(pending)),
        }
    }

    fn observe(&mut self, data: &Bytes) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        p.response_bytes += data.len() as u64;
        if p.capture.is_some() {
            p.captured_bytes += data.len();
            if p.captured_bytes > MAX_CAPTURE_BYTES {
                p.capture = None;
            } else if let Some(c) = p.capture.as_mut() {
                c.chunks.push(data.clone());
            }
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        let Some(p) = self.pending.take() else {
            return;
        };
        let Pending {
            mut finished,
            sinks,
            sent,
            capture,
            blocked,
            response_bytes,
            ..
        } = *p;
        if let Some(decision) = blocked.as_ref().and_then(|b| b.get()) {
            finished.row.decision = Some(decision.action.as_str().into());
            finished.row.applied = crate::intervene::Applied::Blocked.as_str().into();
            finished.decision = Some(decision.clone());
        }
        finished.row.outcome = outcome.as_str().into();
        finished.row.response_bytes = response_bytes as i64;
        finished.row.upstream_total_us = Some(sent.elapsed().as_micros() as i64);
        // Only a response that arrived whole can be decoded meaningfully.
        if let Some(capture) = capture.filter(|_| outcome == Outcome::Complete) {
            finished.settle(capture, &sinks.ledger, crate::store::now_ms());
        }
        finished.hand_over(&sinks.store, &sinks.metrics, &sinks.traces);
    }
}

impl<B> Body for TeeBody<B>
where
    B: Body<Data = Bytes, Error = BodyError> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observe(data);
                }
                // The body's end is settled (its answer charged to the conversation's
                // spend) before the client can have the whole answer: a client cannot send
                // the conversation's next request, which must see this spend, before it.
                // A body of known length ends with its last frame, handed on only now.
                if this.inner.is_end_stream() {
                    this.finish(Outcome::Complete);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let outcome = Outcome::of_body_error(e);
                if let Some(p) = &this.pending {
                    let row = &p.finished.row;
                    crate::warn_per_request!(conversation = %row.conversation_id, path = %row.path, error = %e, "upstream response cut");
                }
                this.finish(outcome);
            }
            // A chunked body ends here, before its last chunk marker goes out.
            Poll::Ready(None) => this.finish(Outcome::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body> Drop for TeeBody<B> {
    fn drop(&mut self) {
        // The server may drop a body it knows is complete without polling its end.
        let outcome = if self.inner.is_end_stream() {
            Outcome::Complete
        } else if self.pending.as_ref().is_some_and(|p| p.sinks.cut.is_done()) {
            if let Some(p) = &self.pending {
                let row = &p.finished.row;
                crate::warn_per_request!(conversation = %row.conversation_id, path = %row.path, "response cut: the shutdown grace ended before it did");
            }
            Outcome::CutAtShutdown
        } else {
            Outcome::ClientDisconnected
        };
        self.finish(outcome);
    }
}
