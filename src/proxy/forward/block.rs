//! Block: the agent never receives the tool call that would complete a loop the policy
//! halts on.
//!
//! A non-streamed answer is read whole (the client waits for all of it anyway) and, when
//! blocked, replaced by the halt reply. A streamed answer goes through [`BlockBody`]: text
//! and every other event are passed on the moment they are complete, tool-call events are
//! held until the call is complete, then released unchanged, or dropped and the stream
//! closed with the dialect's halt tail, so the client sees a well-formed answer that ends
//! with the halt text instead of the call.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::dialect::{StreamDecoder, StreamEventKind};
use crate::transcript::ToolCall;

/// Decides on the complete calls of a response: `Some(halt text)` blocks them. Called at
/// most once per completed call group; it also logs the block and halts the conversation.
pub type Check = Box<dyn FnMut(&[ToolCall]) -> Option<String> + Send>;

/// A streamed upstream answer with tool calls held until complete and checked.
pub struct BlockBody<B> {
    inner: B,
    decoder: StreamDecoder,
    check: Check,
    /// Bytes of events held since the first tool-call event not yet released.
    held: Vec<u8>,
    holding: bool,
    /// Frames ready for the client.
    ready: VecDeque<Bytes>,
    /// The stream was closed by a block (or the upstream ended): nothing more is read.
    done: bool,
}

impl<B> BlockBody<B> {
    pub fn new(inner: B, decoder: StreamDecoder, check: Check) -> BlockBody<B> {
        BlockBody {
            inner,
            decoder,
            check,
            held: Vec::new(),
            holding: false,
            ready: VecDeque::new(),
            done: false,
        }
    }

    fn on_events(&mut self, events: Vec<crate::dialect::StreamEvent>) {
        // Events that pass straight through are sent as one frame, in order.
        let mut pass: Vec<u8> = Vec::new();
        for event in events {
            if self.done {
                return;
            }
            match event.kind {
                StreamEventKind::ToolCallStart | StreamEventKind::ToolCallDelta => {
                    self.holding = true;
                    self.held.extend_from_slice(&event.raw);
                }
                StreamEventKind::ToolCallComplete => {
                    self.held.extend_from_slice(&event.raw);
                    match (self.check)(&event.calls) {
                        Some(text) => {
                            self.push(std::mem::take(&mut pass));
                            let tail = self.decoder.halt_tail(&text);
                            self.held.clear();
                            self.push(tail);
                            self.done = true;
                            return;
                        }
                        None => {
                            pass.append(&mut self.held);
                            self.decoder.mark_released();
                            self.holding = false;
                        }
                    }
                }
                _ if self.holding => self.held.extend_from_slice(&event.raw),
                _ => pass.extend_from_slice(&event.raw),
            }
        }
        self.push(pass);
    }

    fn push(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.ready.push_back(Bytes::from(bytes));
        }
    }
}

impl<B> Body for BlockBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(bytes) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        let events = this.decoder.feed(data);
                        this.on_events(events);
                    }
                    // trailers are not part of any API's answer; dropped
                }
                Poll::Ready(Some(Err(e))) => {
                    // What was held is lost with the broken stream, as it would be without us.
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let events = this.decoder.flush();
                    this.on_events(events);
                    // A call the upstream never completed is released as it came.
                    let held = std::mem::take(&mut this.held);
                    this.push(held);
                    this.done = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.ready.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
