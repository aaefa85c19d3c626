//! What a request will cost before it is sent: its input tokens estimated from the size of
//! its body, per model family, priced at the model's input price. A dollar or token cap is
//! then checked with the next call's input included ([`crate::budget::Ledger::status`]), so
//! that one call cannot cross it by its whole cost (about $4 at a 1M-token context).
//!
//! Only the input is estimated: the output is not known before the answer, and a cap can
//! still be crossed by one answer's output. The estimate counts the body's bytes, JSON
//! syntax and tool definitions included: the APIs count tokens of the same content (the
//! definitions are in the prompt), and the syntax adds a few percent.

/// A model family, as its name says: the families' tokenizers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Claude,
    OpenAi,
    Gemini,
    Other,
}

impl Family {
    pub fn of(model: &str) -> Family {
        let model = model.to_ascii_lowercase();
        let model = model.rsplit('/').next().unwrap_or("");
        if model.starts_with("claude") {
            Family::Claude
        } else if model.starts_with("gpt") || model.starts_with("codex") || is_o_series(model) {
            Family::OpenAi
        } else if model.starts_with("gemini") {
            Family::Gemini
        } else {
            Family::Other
        }
    }

    /// Bytes of a request body per input token. Rules of thumb, not measured against the
    /// providers' counts here (no recorded request has a real count): about four bytes
    /// of English or code per token for OpenAI's and Gemini's tokenizers; Claude's
    /// tokenizer makes more tokens of the same text.
    fn bytes_per_token(self) -> f64 {
        match self {
            Family::Claude => 3.5,
            Family::OpenAi | Family::Gemini | Family::Other => 4.0,
        }
    }
}

/// OpenAI's reasoning models: `o1`, `o3-mini`, `o4`...
fn is_o_series(model: &str) -> bool {
    let mut chars = model.chars();
    chars.next() == Some('o') && chars.next().is_some_and(|c| c.is_ascii_digit())
}

/// The input tokens of a request of `body_bytes` to `model` (`None`: a body that names
/// none, estimated as [`Family::Other`]).
pub fn input_tokens(model: Option<&str>, body_bytes: usize) -> u64 {
    let family = model.map_or(Family::Other, Family::of);
    (body_bytes as f64 / family.bytes_per_token()).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_read_from_the_model_name() {
        assert_eq!(Family::of("claude-opus-5-5"), Family::Claude);
        assert_eq!(Family::of("anthropic/claude-sonnet-5"), Family::Claude);
        assert_eq!(Family::of("gpt-5.5"), Family::OpenAi);
        assert_eq!(Family::of("o4-mini"), Family::OpenAi);
        assert_eq!(Family::of("gemini-3.8-flash"), Family::Gemini);
        assert_eq!(Family::of("omni-local"), Family::Other);
        assert_eq!(input_tokens(Some("claude-opus-5-5"), 3_500_000), 1_000_000);
        assert_eq!(input_tokens(None, 4_000), 1_000);
    }
}
