//! What one answer used, in the same terms for every API.
//!
//! The APIs count the same things differently: OpenAI's `prompt_tokens` (Chat) and
//! `input_tokens` (Responses) include the input read from the prompt cache, which they
//! also report apart (`cached_tokens`); Anthropic's `input_tokens` excludes both the cache
//! reads and the cache writes (`cache_read_input_tokens`, `cache_creation_input_tokens`);
//! Gemini's `promptTokenCount` includes the cached input (`cachedContentTokenCount`), and
//! its `candidatesTokenCount` excludes the thinking (`thoughtsTokenCount`), billed as output
//! all the same. [`Usage::of`] is the one place these rules live.

use serde::{Deserialize, Serialize};

use crate::dialect::{Dialect, ResponseTurn};

/// The tokens of one answer (or of several, summed), split by how they are billed.
///
/// Invariant: the four counts are disjoint, so each token is priced once, at its own
/// price, and the total is their sum. `input` is the input neither read from nor written
/// to the prompt cache; `cached_input` the input read from it; `cache_write` the input
/// written to it (Anthropic only: the other APIs cache for free); `output` everything
/// generated, reasoning and thinking included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Usage {
    pub input: u64,
    pub cached_input: u64,
    pub cache_write: u64,
    pub output: u64,
}

impl Usage {
    /// The usage an answer of `dialect` reports, or `None` when it reports none (an
    /// OpenAI Chat stream whose request did not ask for `stream_options.include_usage`).
    pub fn of(dialect: Dialect, turn: &ResponseTurn) -> Option<Usage> {
        if turn.input_tokens.is_none() && turn.output_tokens.is_none() {
            return None;
        }
        let reported = turn.input_tokens.unwrap_or(0);
        let cached = turn.cached_input_tokens.unwrap_or(0);
        let output = turn.output_tokens.unwrap_or(0);
        Some(match dialect {
            // Cached input is part of the prompt count.
            Dialect::OpenAiChat | Dialect::OpenAiResponses => Usage {
                input: reported.saturating_sub(cached),
                cached_input: cached,
                cache_write: 0,
                output,
            },
            // Cache reads and writes are counted apart from the input.
            Dialect::Anthropic => Usage {
                input: reported,
                cached_input: cached,
                cache_write: turn.cache_write_tokens.unwrap_or(0),
                output,
            },
            // Cached input is part of the prompt count; thoughts are apart from the output.
            Dialect::Gemini => Usage {
                input: reported.saturating_sub(cached),
                cached_input: cached,
                cache_write: 0,
                output: output + turn.thought_tokens.unwrap_or(0),
            },
        })
    }

    /// Every token, whatever its price.
    pub fn total(&self) -> u64 {
        self.input + self.cached_input + self.cache_write + self.output
    }

    /// Adds `other` to this usage.
    pub fn add(&mut self, other: &Usage) {
        self.input += other.input;
        self.cached_input += other.cached_input;
        self.cache_write += other.cache_write;
        self.output += other.output;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(dialect: Dialect, answer: &str) -> Usage {
        let turn = dialect.parse_response(answer.as_bytes()).unwrap();
        Usage::of(dialect, &turn).unwrap()
    }

    fn streamed(dialect: Dialect, stream: &str) -> Usage {
        let mut decoder = dialect.stream_decoder();
        decoder.feed(stream.as_bytes());
        Usage::of(dialect, &decoder.finish()).unwrap()
    }

    const EXPECTED: Usage = Usage {
        input: 100,
        cached_input: 900,
        cache_write: 0,
        output: 50,
    };

    #[test]
    fn openai_chat_counts_its_cached_tokens_inside_the_prompt() {
        let usage = r#""usage":{"prompt_tokens":1000,"completion_tokens":50,"total_tokens":1050,
            "prompt_tokens_details":{"cached_tokens":900},"completion_tokens_details":{"reasoning_tokens":20}}"#;
        let json = format!(
            r#"{{"choices":[{{"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],{usage}}}"#
        );
        assert_eq!(decoded(Dialect::OpenAiChat, &json), EXPECTED);
        // The usage comes last, in a chunk without choices (`include_usage`).
        let usage = usage.replace('\n', "");
        let stream = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"hi\"}}}}],\"usage\":null}}\n\n\
             data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n\
             data: {{\"choices\":[],{usage}}}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(streamed(Dialect::OpenAiChat, &stream), EXPECTED);
        // Without `include_usage` a stream says nothing: no usage, not a zero one.
        let mut decoder = Dialect::OpenAiChat.stream_decoder();
        decoder.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        assert_eq!(Usage::of(Dialect::OpenAiChat, &decoder.finish()), None);
    }

    #[test]
    fn openai_responses_counts_its_cached_tokens_inside_the_input() {
        let response = r#"{"id":"resp_1","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}],
            "usage":{"input_tokens":1000,"input_tokens_details":{"cached_tokens":900},"output_tokens":50,
            "output_tokens_details":{"reasoning_tokens":30},"total_tokens":1050}}"#;
        assert_eq!(decoded(Dialect::OpenAiResponses, response), EXPECTED);
        let stream = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}}}\n\n\
             event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{}}}\n\n",
            response.replace('\n', "")
        );
        assert_eq!(streamed(Dialect::OpenAiResponses, &stream), EXPECTED);
    }

    #[test]
    fn anthropic_counts_cache_reads_and_writes_apart_from_the_input() {
        let json = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn",
            "usage":{"input_tokens":100,"cache_creation_input_tokens":300,"cache_read_input_tokens":900,"output_tokens":50}}"#;
        let expected = Usage {
            cache_write: 300,
            ..EXPECTED
        };
        assert_eq!(decoded(Dialect::Anthropic, json), expected);
        // The input's counts come in `message_start`, the output's in `message_delta`.
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"content\":[],\
            \"usage\":{\"input_tokens\":100,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":900,\"output_tokens\":1}}}\n\n\
            event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
            event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":50}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(streamed(Dialect::Anthropic, stream), expected);
    }

    #[test]
    fn gemini_counts_cached_input_inside_the_prompt_and_thoughts_as_output() {
        let usage = r#""usageMetadata":{"promptTokenCount":1000,"cachedContentTokenCount":900,"candidatesTokenCount":30,"thoughtsTokenCount":20,"totalTokenCount":1050}"#;
        let json = format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"text":"hi"}}]}},"finishReason":"STOP"}}],{usage}}}"#
        );
        assert_eq!(decoded(Dialect::Gemini, &json), EXPECTED);
        // Each chunk repeats the counts so far; the last one's hold.
        let stream = format!(
            "data: {{\"candidates\":[{{\"content\":{{\"role\":\"model\",\"parts\":[{{\"text\":\"h\"}}]}}}}],\"usageMetadata\":{{\"promptTokenCount\":1000,\"cachedContentTokenCount\":900,\"candidatesTokenCount\":1,\"thoughtsTokenCount\":20}}}}\r\n\r\n\
             data: {{\"candidates\":[{{\"content\":{{\"role\":\"model\",\"parts\":[{{\"text\":\"i\"}}]}},\"finishReason\":\"STOP\"}}],{usage}}}\r\n\r\n"
        );
        assert_eq!(streamed(Dialect::Gemini, &stream), EXPECTED);
    }

    #[test]
    fn counts_an_api_leaves_out_are_zero() {
        let json = r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let usage = decoded(Dialect::OpenAiChat, json);
        assert_eq!(
            usage,
            Usage {
                input: 12,
                output: 3,
                ..Usage::default()
            }
        );
        assert_eq!(usage.total(), 15);
    }
}
