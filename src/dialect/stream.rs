//! Reading a streamed answer as it passes: [`StreamDecoder`] is fed raw chunks and
//! returns events, each with its exact bytes and a kind, so an intervention layer can
//! forward text at once, hold tool-call events until the call is complete, and then
//! release them or close the stream with [`StreamDecoder::halt_tail`].
//!
//! The framing (SSE, or Gemini's JSON array) is in `framing`; what each event means is
//! in the wire module of its API.

use super::framing::{Frame, Framer};
use super::{anthropic, gemini, openai_chat, openai_responses, Dialect, ResponseTurn};
use crate::transcript::ToolCall;

/// What one stream event carries, as far as interventions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEventKind {
    /// Assistant text (or the start/end of a text block): safe to forward at once.
    Text,
    /// A tool call begins (its name is known, arguments follow).
    ToolCallStart,
    /// More of a tool call's arguments.
    ToolCallDelta,
    /// One or more calls are now complete; they are in [`StreamEvent::calls`]. May come
    /// without a start (Gemini sends a call whole; OpenAI Chat completes all calls of
    /// the turn with its `finish_reason` chunk).
    ToolCallComplete,
    /// The answer is over (stop reason, final usage, `[DONE]`, `message_stop`...).
    MessageEnd,
    /// Anything else: pings, metadata, thinking, keep-alive comments.
    Other,
}

/// One event of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub kind: StreamEventKind,
    /// The event's exact bytes: forwarding every event's `raw` in order reproduces the
    /// stream byte for byte.
    pub raw: Vec<u8>,
    /// The calls this event completed (only for [`StreamEventKind::ToolCallComplete`]).
    pub calls: Vec<ToolCall>,
}

/// A tool call being assembled from deltas.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartialCall {
    pub id: String,
    pub name: String,
    pub args: String,
    /// Freeform input (Responses `custom_tool_call`): kept as one string, not parsed.
    pub freeform: bool,
}

impl PartialCall {
    pub fn to_call(&self) -> ToolCall {
        ToolCall {
            id: self.id.clone(),
            name: self.name.clone(),
            args: if self.freeform {
                serde_json::Value::String(self.args.clone())
            } else {
                super::args_from_text(&self.args)
            },
        }
    }
}

/// The per-API meaning of events.
#[derive(Debug)]
enum Wire {
    Chat(openai_chat::Stream),
    Responses(openai_responses::Stream),
    Anthropic(anthropic::Stream),
    Gemini(gemini::Stream),
}

/// Decodes one streamed answer incrementally. Never panics on bad input: what it
/// cannot read is passed on as [`StreamEventKind::Other`].
#[derive(Debug)]
pub struct StreamDecoder {
    framer: Framer,
    wire: Wire,
    frames: Vec<Frame>,
}

impl Dialect {
    /// A decoder for one streamed answer of this API.
    pub fn stream_decoder(self) -> StreamDecoder {
        let (framer, wire) = match self {
            Dialect::OpenAiChat => (Framer::sse(), Wire::Chat(Default::default())),
            Dialect::OpenAiResponses => (Framer::sse(), Wire::Responses(Default::default())),
            Dialect::Anthropic => (Framer::sse(), Wire::Anthropic(Default::default())),
            Dialect::Gemini => (Framer::sniffing(), Wire::Gemini(Default::default())),
        };
        StreamDecoder {
            framer,
            wire,
            frames: Vec::new(),
        }
    }

    /// The turn of a whole streamed answer, read from its chunks as they arrived: what
    /// [`StreamDecoder::feed`] on each and [`StreamDecoder::finish`] give, for a reader that
    /// wants the turn only (the log, the ledger). No event is made, and no frame keeps a
    /// copy of its bytes.
    pub fn stream_turn<'c>(self, chunks: impl IntoIterator<Item = &'c [u8]>) -> ResponseTurn {
        let mut decoder = self.stream_decoder();
        decoder.framer = decoder.framer.bare();
        let mut frames = Vec::new();
        for chunk in chunks {
            decoder.framer.feed(chunk, &mut frames);
            decoder.read(&mut frames);
        }
        decoder.framer.flush(&mut frames);
        decoder.read(&mut frames);
        decoder.turn()
    }
}

impl StreamDecoder {
    /// Feeds the next chunk as it arrived; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<StreamEvent> {
        let mut frames = std::mem::take(&mut self.frames);
        self.framer.feed(chunk, &mut frames);
        let events = self.decode(&mut frames);
        self.frames = frames;
        events
    }

    /// The upstream ended: returns whatever it left unterminated as a last event.
    pub fn flush(&mut self) -> Vec<StreamEvent> {
        let mut frames = std::mem::take(&mut self.frames);
        self.framer.flush(&mut frames);
        let events = self.decode(&mut frames);
        self.frames = frames;
        events
    }

    fn decode(&mut self, frames: &mut Vec<Frame>) -> Vec<StreamEvent> {
        frames
            .drain(..)
            .map(|frame| {
                let (kind, calls) = self.on_frame(&frame);
                StreamEvent {
                    kind,
                    raw: frame.raw,
                    calls,
                }
            })
            .collect()
    }

    /// [`StreamDecoder::decode`] for the turn alone: the frames are read, no event made,
    /// and handed back to the framer.
    fn read(&mut self, frames: &mut Vec<Frame>) {
        for frame in frames.iter() {
            self.on_frame(frame);
        }
        self.framer.recycle(frames);
    }

    /// What `frame` means to the answer's API; the state it changes is the turn's.
    fn on_frame(&mut self, frame: &Frame) -> (StreamEventKind, Vec<ToolCall>) {
        let json_array = self.framer.is_json_array();
        match &mut self.wire {
            Wire::Chat(s) => s.on_frame(frame),
            Wire::Responses(s) => s.on_frame(frame),
            Wire::Anthropic(s) => s.on_frame(frame),
            Wire::Gemini(s) => s.on_frame(frame, json_array),
        }
    }

    /// The answer as received so far (call after the stream ended for the whole turn):
    /// text, calls with their arguments reassembled, usage and stop reason.
    pub fn finish(&mut self) -> ResponseTurn {
        self.flush();
        self.turn()
    }

    fn turn(&self) -> ResponseTurn {
        match &self.wire {
            Wire::Chat(s) => s.turn(),
            Wire::Responses(s) => s.turn(),
            Wire::Anthropic(s) => s.turn(),
            Wire::Gemini(s) => s.turn(),
        }
    }

    /// Tells the decoder that every event fed so far has reached the client (held
    /// events were released). [`StreamDecoder::halt_tail`] then closes the stream after
    /// them instead of in place of them.
    pub fn mark_released(&mut self) {
        match &mut self.wire {
            Wire::Chat(s) => s.mark_released(),
            Wire::Responses(s) => s.mark_released(),
            Wire::Anthropic(s) => s.mark_released(),
            Wire::Gemini(s) => s.mark_released(),
        }
    }

    /// The bytes that end the stream well-formed with `text` as the last of the answer,
    /// in place of the held tool call(s). The client is assumed to have received every
    /// event before the first tool-call event fed since the last
    /// [`StreamDecoder::mark_released`] (or since the start), and none after it; the
    /// tail continues the content/output indexes the client saw.
    pub fn halt_tail(&self, text: &str) -> Vec<u8> {
        match &self.wire {
            Wire::Chat(s) => s.halt_tail(text),
            Wire::Responses(s) => s.halt_tail(text),
            Wire::Anthropic(s) => s.halt_tail(text),
            Wire::Gemini(s) => s.halt_tail(text, self.framer.is_json_array()),
        }
    }
}
