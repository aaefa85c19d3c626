//! How a streamed answer is cut into events, whatever the API: Server-Sent Events
//! (all four APIs) and the bare JSON array Gemini streams without `?alt=sse`.
//!
//! A framer is fed raw chunks as they arrive (an event may be split across chunks, or a
//! chunk hold several events) and returns every event completed so far, each with its
//! exact bytes, so the concatenation of all frames' `raw` is the stream itself. Each
//! byte is looked at once: the cost is O(chunk).

use std::borrow::Cow;

/// One event of a stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Frame {
    /// The exact bytes of the event, separators included.
    pub raw: Vec<u8>,
    /// The SSE `event:` field, empty when absent.
    pub event: String,
    /// The event's payload: SSE `data:` lines joined with `\n`, or one JSON array element.
    pub data: String,
}

/// An event larger than this without an end is given up on: it is passed on as an
/// opaque frame so memory stays bounded on a garbage stream.
const MAX_PENDING: usize = 16 << 20;

/// Splits a byte stream at SSE event boundaries (a blank line; LF, CRLF or CR line ends).
#[derive(Debug, Default)]
pub(crate) struct SseFramer {
    buf: Vec<u8>,
    /// Where scanning for the next line end resumes, so no byte is scanned twice.
    scan: usize,
    /// Start of the current line in `buf`.
    line_start: usize,
    /// The previous byte was a CR, so an LF right after it ends nothing new.
    after_cr: bool,
    /// Frames are made without a copy of their bytes (`raw` empty): for a reader of the
    /// whole answer ([`Framer::bare`]), which wants their fields only.
    bare: bool,
    /// Frames read and handed back ([`Framer::recycle`], bare only): their strings are
    /// filled again for the next events, not allocated for each.
    spare: Vec<Frame>,
}

impl SseFramer {
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Frame>) {
        self.buf.extend_from_slice(chunk);
        let mut event_start = 0;
        // Only line ends matter: the bytes between them are skipped with memchr (a
        // byte-by-byte loop here was most of what logging a streamed answer cost).
        loop {
            let Some(found) = memchr::memchr2(b'\n', b'\r', &self.buf[self.scan..]) else {
                if self.scan < self.buf.len() {
                    self.after_cr = false;
                    self.scan = self.buf.len();
                }
                break;
            };
            if found > 0 {
                self.after_cr = false; // a byte of a line came after the CR
            }
            let b = self.buf[self.scan + found];
            self.scan += found + 1;
            match b {
                b'\n' if self.after_cr => {
                    // second half of a CRLF: the line already ended at the CR
                    self.after_cr = false;
                    self.line_start = self.scan;
                }
                // A CR at the end of what we have: wait for the next byte to know if it
                // starts a CRLF, so an event's bytes never depend on where chunks split.
                b'\r' if self.scan == self.buf.len() => {
                    self.scan -= 1;
                    break;
                }
                // Any other line end (memchr2 finds only these two bytes).
                _ => {
                    self.after_cr = b == b'\r';
                    let blank = self.scan - 1 == self.line_start;
                    self.line_start = self.scan;
                    if blank {
                        // A CRLF blank line: take its LF too when it is already here.
                        let mut end = self.scan;
                        if self.after_cr && self.buf.get(end) == Some(&b'\n') {
                            end += 1;
                            self.scan = end;
                            self.line_start = end;
                            self.after_cr = false;
                        }
                        let frame = self.spare.pop().unwrap_or_default();
                        let event = &self.buf[event_start..end];
                        out.push(parse_sse_event(event, self.bare, frame));
                        event_start = end;
                    }
                }
            }
        }
        if event_start > 0 {
            self.buf.drain(..event_start);
            self.scan -= event_start;
            self.line_start -= event_start;
        }
        if self.buf.len() > MAX_PENDING {
            self.flush(out);
        }
    }

    /// Passes on whatever is left (an event the stream ended without closing).
    pub fn flush(&mut self, out: &mut Vec<Frame>) {
        if !self.buf.is_empty() {
            out.push(parse_sse_event(&self.buf, self.bare, Frame::default()));
        }
        *self = SseFramer {
            bare: self.bare,
            ..SseFramer::default()
        };
    }
}

/// `bytes` as text, invalid UTF-8 replaced. Checked first ([`super::utf8`]): the lossy
/// decoder reads a byte at a time (~9 instructions a byte, 7 % of the whole proxy's
/// instructions per streamed 8.8 KB answer), and what streams carry is almost always valid.
fn text_of(bytes: &[u8]) -> Cow<'_, str> {
    match crate::scan::utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Reads the fields of one SSE event (`raw` ends with its blank line, or is a tail). Lines
/// end at LF or CR (a CRLF leaves an empty line between, which reads as nothing); each is
/// `field: value` or a bare field. Only the values are decoded as text (invalid UTF-8
/// replaced), and only the ones read. `bare`: the frame keeps no copy of `raw`. `frame`: a
/// frame to fill (its strings' room is reused), what it held is dropped.
fn parse_sse_event(raw: &[u8], bare: bool, frame: Frame) -> Frame {
    let Frame {
        raw: mut bytes,
        mut event,
        mut data,
    } = frame;
    bytes.clear();
    event.clear();
    data.clear();
    let mut has_data = false;
    let mut start = 0;
    let ends = memchr::memchr2_iter(b'\n', b'\r', raw).chain(std::iter::once(raw.len()));
    for end in ends {
        let line = &raw[start..end];
        start = end + 1;
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if has_data {
                    data.push('\n');
                }
                data.push_str(&text_of(value));
                has_data = true;
            }
            b"event" => {
                event.clear();
                event.push_str(&text_of(value));
            }
            // comments (`: keep-alive`), id, retry: nothing we read
            _ => {}
        }
    }
    if !bare {
        bytes.extend_from_slice(raw);
    }
    Frame {
        raw: bytes,
        event,
        data,
    }
}

/// Splits a streamed JSON array (`[{…},\r\n{…}]`) into its elements. Each frame's raw
/// bytes include the separators before the element (`[` or `,` and whitespace); the
/// closing `]` is its own frame.
#[derive(Debug, Default)]
pub(crate) struct JsonArrayFramer {
    buf: Vec<u8>,
    scan: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the current element's JSON starts in `buf`.
    element_start: Option<usize>,
}

impl JsonArrayFramer {
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Frame>) {
        self.buf.extend_from_slice(chunk);
        let mut cut = 0;
        while self.scan < self.buf.len() {
            let b = self.buf[self.scan];
            let at = self.scan;
            self.scan += 1;
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    if self.depth == 1 {
                        self.element_start = Some(at);
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 1 {
                        if let Some(start) = self.element_start.take() {
                            out.push(Frame {
                                raw: self.buf[cut..self.scan].to_vec(),
                                event: String::new(),
                                data: text_of(&self.buf[start..self.scan]).into_owned(),
                            });
                            cut = self.scan;
                        }
                    } else if self.depth == 0 {
                        // the array's closing bracket
                        out.push(Frame {
                            raw: self.buf[cut..self.scan].to_vec(),
                            event: String::new(),
                            data: String::new(),
                        });
                        cut = self.scan;
                    }
                }
                _ => {}
            }
        }
        if cut > 0 {
            self.buf.drain(..cut);
            self.scan -= cut;
            if let Some(start) = self.element_start.as_mut() {
                *start -= cut;
            }
        }
        if self.buf.len() > MAX_PENDING {
            self.flush(out);
        }
    }

    pub fn flush(&mut self, out: &mut Vec<Frame>) {
        if !self.buf.is_empty() {
            out.push(Frame {
                raw: std::mem::take(&mut self.buf),
                event: String::new(),
                data: String::new(),
            });
        }
        *self = JsonArrayFramer::default();
    }
}

/// The framing of one response stream. Gemini's stream is SSE with `?alt=sse` and a
/// JSON array without it; the first byte that is not whitespace tells which.
#[derive(Debug)]
pub(crate) enum Framer {
    Sse(SseFramer),
    JsonArray(JsonArrayFramer),
    /// Gemini, before the first significant byte (`bare`: as [`Framer::bare`] made it).
    Sniffing {
        pending: Vec<u8>,
        bare: bool,
    },
}

impl Framer {
    pub fn sse() -> Framer {
        Framer::Sse(SseFramer::default())
    }

    pub fn sniffing() -> Framer {
        Framer::Sniffing {
            pending: Vec::new(),
            bare: false,
        }
    }

    /// Takes back frames that were read, emptying `frames`: a bare SSE framer fills them
    /// again for the next events.
    pub fn recycle(&mut self, frames: &mut Vec<Frame>) {
        match self {
            Framer::Sse(f) if f.bare => f.spare.append(frames),
            _ => frames.clear(),
        }
    }

    /// The same framing, for a reader that wants the events' fields only: SSE frames come
    /// without a copy of their bytes (`raw` empty). A JSON array's keep theirs (Gemini
    /// reads its closing bracket there).
    pub fn bare(self) -> Framer {
        match self {
            Framer::Sse(f) => Framer::Sse(SseFramer { bare: true, ..f }),
            Framer::Sniffing { pending, .. } => Framer::Sniffing {
                pending,
                bare: true,
            },
            json_array @ Framer::JsonArray(_) => json_array,
        }
    }

    pub fn is_json_array(&self) -> bool {
        matches!(self, Framer::JsonArray(_))
    }

    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Frame>) {
        if let Framer::Sniffing { pending, bare } = self {
            let Some(first) = chunk.iter().find(|b| !b.is_ascii_whitespace()) else {
                pending.extend_from_slice(chunk);
                return;
            };
            let mut head = std::mem::take(pending);
            head.extend_from_slice(chunk);
            *self = if *first == b'[' {
                Framer::JsonArray(JsonArrayFramer::default())
            } else {
                Framer::Sse(SseFramer {
                    bare: *bare,
                    ..SseFramer::default()
                })
            };
            return self.feed(&head, out);
        }
        match self {
            Framer::Sse(f) => f.feed(chunk, out),
            Framer::JsonArray(f) => f.feed(chunk, out),
            Framer::Sniffing { .. } => {}
        }
    }

    pub fn flush(&mut self, out: &mut Vec<Frame>) {
        match self {
            Framer::Sse(f) => f.flush(out),
            Framer::JsonArray(f) => f.flush(out),
            Framer::Sniffing { pending, .. } => {
                if !pending.is_empty() {
                    out.push(Frame {
                        raw: std::mem::take(pending),
                        event: String::new(),
                        data: String::new(),
                    });
                }
            }
        }
    }
}

/// Writes one SSE event. `line_end` is `"\n"`, or `"\r\n"` for Gemini, which frames
/// its events that way.
pub(crate) fn write_sse(out: &mut Vec<u8>, event: Option<&str>, data: &str, line_end: &str) {
    if let Some(event) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.as_bytes());
        out.extend_from_slice(line_end.as_bytes());
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(line_end.as_bytes());
    out.extend_from_slice(line_end.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(framer: &mut Framer, chunks: &[&[u8]]) -> Vec<Frame> {
        let mut out = Vec::new();
        for c in chunks {
            framer.feed(c, &mut out);
        }
        framer.flush(&mut out);
        out
    }

    #[test]
    fn sse_split_anywhere_gives_the_same_events() {
        let stream = b"event: a\ndata: {\"x\":1}\n\n: keep-alive\n\ndata: one\ndata: two\r\n\r\ndata: [DONE]\n\n";
        let whole = frames_of(&mut Framer::sse(), &[stream]);
        assert_eq!(whole.len(), 4);
        assert_eq!(whole[0].event, "a");
        assert_eq!(whole[0].data, "{\"x\":1}");
        assert_eq!(whole[2].data, "one\ntwo");
        assert_eq!(whole[3].data, "[DONE]");
        for split in 0..stream.len() {
            let parts = frames_of(&mut Framer::sse(), &[&stream[..split], &stream[split..]]);
            assert_eq!(parts, whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(frames_of(&mut Framer::sse(), &bytes), whole);
        let joined: Vec<u8> = whole.iter().flat_map(|f| f.raw.clone()).collect();
        assert_eq!(joined, stream);
    }

    /// The events of a whole stream read the plainest way, as the SSE spec words it: lines
    /// end at CRLF, LF or CR, a blank line ends an event, and an event's text is decoded
    /// whole before its lines are split.
    fn read_plainly(stream: &[u8]) -> Vec<Frame> {
        let event_of = |raw: &[u8]| {
            let text = String::from_utf8_lossy(raw);
            let mut event = String::new();
            let mut data = Vec::new();
            for line in text.split(['\n', '\r']) {
                let (field, value) = line
                    .split_once(':')
                    .map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
                match field {
                    "data" => data.push(value.to_string()),
                    "event" => event = value.to_string(),
                    _ => {}
                }
            }
            Frame {
                raw: raw.to_vec(),
                event,
                data: data.join("\n"),
            }
        };
        let mut frames = Vec::new();
        let (mut i, mut event_start, mut line_start) = (0, 0, 0);
        while i < stream.len() {
            if stream[i] != b'\n' && stream[i] != b'\r' {
                i += 1;
                continue;
            }
            let mut end = i + 1;
            if stream[i] == b'\r' && stream.get(end) == Some(&b'\n') {
                end += 1;
            }
            if i == line_start {
                frames.push(event_of(&stream[event_start..end]));
                event_start = end;
            }
            line_start = end;
            i = end;
        }
        if event_start < stream.len() {
            frames.push(event_of(&stream[event_start..]));
        }
        frames
    }

    /// What the streams below are made of: SSE's own bytes, text, and invalid UTF-8.
    const PIECES: [&[u8]; 14] = [
        b"data",
        b"event",
        b":",
        b" ",
        b"\r",
        b"\n",
        b"\r\n",
        b"x",
        b"{\"a\":1}",
        "\u{e9}".as_bytes(),
        b"\xff",
        b"\xc3",
        b"id",
        b": keep-alive",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
        #[test]
        fn sse_frames_match_a_plain_reading_of_any_stream_split_anywhere(
            picks in proptest::collection::vec(0..PIECES.len(), 0..40),
            cuts in (0.0..=1.0f64, 0.0..=1.0f64),
        ) {
            let stream: Vec<u8> = picks.iter().flat_map(|&i| PIECES[i].iter().copied()).collect();
            let expected = read_plainly(&stream);
            proptest::prop_assert_eq!(&frames_of(&mut Framer::sse(), &[&stream]), &expected);
            let (x, y) = (cuts.0 * stream.len() as f64, cuts.1 * stream.len() as f64);
            let (a, b) = (x.min(y) as usize, x.max(y) as usize);
            let split = [&stream[..a], &stream[a..b], &stream[b..]];
            proptest::prop_assert_eq!(&frames_of(&mut Framer::sse(), &split), &expected);
        }
    }

    #[test]
    fn json_array_elements_keep_their_bytes() {
        let stream = b"[{\"a\":\"}]\\\"\"},\r\n{\"b\":[1,{\"c\":2}]}\r\n]";
        let whole = frames_of(&mut Framer::sniffing(), &[stream]);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].data, "{\"a\":\"}]\\\"\"}");
        assert_eq!(whole[1].data, "{\"b\":[1,{\"c\":2}]}");
        assert_eq!(whole[2].raw, b"\r\n]");
        for split in 0..stream.len() {
            let parts = frames_of(
                &mut Framer::sniffing(),
                &[&stream[..split], &stream[split..]],
            );
            assert_eq!(parts, whole, "split at {split}");
        }
    }
}
