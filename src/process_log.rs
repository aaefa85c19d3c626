//! The process log (stderr): its level filter and format, and the one rule every line
//! keeps: a control character in a value (a newline, a carriage return, an ANSI escape) is
//! written escaped (`\n`, `\u{1b}`). Clients choose much of what reaches a line (a path, a
//! conversation id, a `previous_response_id`, an error that quotes them); unescaped, a
//! newline in one forges a line of its own (`... ERROR ...`) and an escape sequence drives
//! the terminal that shows the log. The rule sits in the field formatter, so no call site
//! has to remember it.

use std::fmt::{self, Write as _};

use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{self, FormatFields, Writer};

/// Installs the process log: `RUST_LOG`'s filter (default `info`), to stderr, in colour
/// when `colour` (the level's colour is the formatter's own; values never carry any).
pub fn init(colour: bool) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .fmt_fields(fields())
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}

/// The fields of a line as the default format writes them (the message, then
/// `name=value` pairs, space-separated), each value escaped ([`escape`]).
pub fn fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    format::debug_fn(
        |writer: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug| {
            if field.name() != "message" {
                write!(writer, "{}=", field.name())?;
            }
            write!(Escaped(writer), "{value:?}")
        },
    )
    .delimited(" ")
}

/// A writer that passes text on with its control characters escaped.
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        escape(text, self.0)
    }
}

/// Writes `text` to `out` with each control character escaped: `\n`, `\r` and `\t` as
/// such, any other (ESC, DEL, the C1 range) as `\u{..}`. Every other character, and the
/// text between, is written as it is.
pub fn escape(text: &str, out: &mut impl fmt::Write) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(char::is_control) {
        out.write_str(&rest[..at])?;
        let mut chars = rest[at..].chars();
        match chars.next() {
            Some('\n') => out.write_str("\\n")?,
            Some('\r') => out.write_str("\\r")?,
            Some('\t') => out.write_str("\\t")?,
            Some(c) => write!(out, "\\u{{{:x}}}", u32::from(c))?,
            None => {}
        }
        rest = chars.as_str();
    }
    out.write_str(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        let mut out = String::new();
        escape("a\nb\r\tc\u{1b}[31md\u{7f}é→", &mut out).unwrap();
        assert_eq!(out, "a\\nb\\r\\tc\\u{1b}[31md\\u{7f}é→");
    }

    /// What a subscriber with [`fields`] writes for one event whose fields and message
    /// carry a client's newline and escape sequence.
    #[test]
    fn a_client_s_value_cannot_forge_a_line_or_colour_the_terminal() {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let written = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(fields())
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        let forged = "resp_1\n2026-12-07T00:00:00Z ERROR loopwarden: forged\u{1b}[2J";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(previous_response_id = %forged, path = forged, "continues {forged}");
        });
        let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(
            text.contains("previous_response_id=resp_1\\n2026-12-07T00:00:00Z ERROR"),
            "{text}"
        );
        assert!(text.contains("continues resp_1\\n"), "{text}");
    }
}
