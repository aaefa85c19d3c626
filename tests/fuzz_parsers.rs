//! A mutation harness for every parser of client and upstream bytes, on the stable
//! toolchain: seeds are real captured requests and answers (`tests/fixtures/`), mutated by
//! flipped, deleted, inserted and repeated bytes and cut short. Whatever the bytes:
//! - nothing panics (request views, messages, reminders, halts, answers, streams);
//! - a request read after the one before it (the proxy's resumed read) reads as from
//!   scratch: the same transcript, or the same refusal;
//! - a streamed answer decodes the same however its bytes are split into chunks.
//!
//! Bounded for CI: `LW_FUZZ_CASES` cases per target (default 256); raise it to fuzz longer.

mod fixture_support;

use bytes::Bytes;
use fixture_support::{fixture, REQUESTS};
use loopwarden::config::CacheConfig;
use loopwarden::dialect::Dialect;
use loopwarden::proxy::memory::Memory;
use loopwarden::request_bytes::RequestBytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const ANSWERS: [(Dialect, &str); 5] = [
    (Dialect::Anthropic, "responses/anthropic.json"),
    (Dialect::OpenAiChat, "responses/openai-chat.json"),
    (Dialect::OpenAiResponses, "responses/openai-responses.json"),
    (Dialect::Gemini, "responses/gemini.json"),
    (Dialect::Gemini, "responses/gemini-array.json"),
];

const STREAMS: [(Dialect, &str); 4] = [
    (Dialect::Anthropic, "responses/anthropic.sse"),
    (Dialect::OpenAiChat, "responses/openai-chat.sse"),
    (Dialect::OpenAiResponses, "responses/openai-responses.sse"),
    (Dialect::Gemini, "responses/gemini.sse"),
];

fn runner() -> TestRunner {
    let cases = std::env::var("LW_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// One change to a body: at a position (a fraction of its length), with some bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(f64, u8),
    Delete(f64, usize),
    Insert(f64, Vec<u8>),
    Repeat(f64, usize),
    Cut(f64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that matter to JSON and SSE more often than chance would give them.
    let byte = prop_oneof![
        Just(b'"'),
        Just(b'\\'),
        Just(b'{'),
        Just(b'}'),
        Just(b'['),
        Just(b']'),
        Just(b','),
        Just(b':'),
        Just(b'\n'),
        Just(0xff),
        Just(0xe9),
        any::<u8>(),
    ];
    let at = 0.0..1.0f64;
    prop_oneof![
        (at.clone(), byte.clone()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        (at.clone(), 1..64usize).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (at.clone(), proptest::collection::vec(byte, 1..8))
            .prop_map(|(a, b)| Mutation::Insert(a, b)),
        (at.clone(), 1..256usize).prop_map(|(a, n)| Mutation::Repeat(a, n)),
        at.prop_map(Mutation::Cut),
    ]
}

fn mutate(mut body: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let pos = |f: f64| ((body.len() as f64 * f) as usize).min(body.len());
        match m {
            Mutation::Flip(f, b) => {
                let i = pos(*f);
                if i < body.len() {
                    body[i] = *b;
                }
            }
            Mutation::Delete(f, n) => {
                let i = pos(*f);
                let end = (i + n).min(body.len());
                body.drain(i..end);
            }
            Mutation::Insert(f, bytes) => {
                let i = pos(*f);
                body.splice(i..i, bytes.iter().copied());
            }
            Mutation::Repeat(f, n) => {
                let i = pos(*f);
                let end = (i + n).min(body.len());
                let copy = body[i..end].to_vec();
                body.splice(end..end, copy);
            }
            Mutation::Cut(f) => body.truncate(pos(*f)),
        }
    }
    body
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..4)
}

fn whole(bytes: &[u8]) -> RequestBytes {
    RequestBytes::from(Bytes::copy_from_slice(bytes))
}

/// Every reading of a request body: no panic, and the resumed read is the cold one.
#[test]
fn mutated_requests_never_panic_and_read_after_their_predecessor_as_from_scratch() {
    for (dialect, name) in REQUESTS {
        let seed = fixture(name);
        let stream_path = dialect == Dialect::Gemini;
        runner()
            .run(&mutations(), |ms| {
                let body = mutate(seed.clone(), &ms);
                if let Ok(view) = dialect.view(&body, stream_path) {
                    for m in &view.messages {
                        dialect.parse_message(m.get());
                    }
                    dialect.read_preamble(view.preamble_source);
                }
                let _ = dialect.parse_request(&body, stream_path);
                let _ = dialect.append_reminder(&body, "a reminder");
                dialect.first_messages(&body, 2);

                // The proxy's read after the seed, kept as the conversation's last request.
                let memory = Memory::new(&CacheConfig::default());
                let first = memory
                    .messages
                    .read_history(dialect, &whole(&seed), stream_path, None, None)
                    .expect("the seed reads");
                let mut last = first.request;
                last.keep_transcript(first.transcript, None, None);
                let after = memory.messages.read_history(
                    dialect,
                    &whole(&body),
                    stream_path,
                    Some(last),
                    None,
                );
                let cold = Memory::new(&CacheConfig::default()).messages.read_history(
                    dialect,
                    &whole(&body),
                    stream_path,
                    None,
                    None,
                );
                match (after, cold) {
                    (Ok(a), Ok(c)) => prop_assert_eq!(a.transcript, c.transcript),
                    (Err(a), Err(c)) => prop_assert_eq!(a.to_string(), c.to_string()),
                    (a, c) => prop_assert!(
                        false,
                        "{name}: after {:?} vs cold {:?}",
                        a.map(|h| h.transcript),
                        c.map(|h| h.transcript)
                    ),
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Answers as JSON: no panic.
#[test]
fn mutated_answers_never_panic() {
    for (dialect, name) in ANSWERS {
        let seed = fixture(name);
        runner()
            .run(&mutations(), |ms| {
                let _ = dialect.parse_response(&mutate(seed.clone(), &ms));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Streamed answers: no panic, and the same events and turn however the bytes are split.
#[test]
fn mutated_streams_decode_the_same_however_they_are_split() {
    for (dialect, name) in STREAMS {
        let seed = fixture(name);
        let cuts = proptest::collection::vec(0.0..1.0f64, 0..12);
        runner()
            .run(&(mutations(), cuts), |(ms, cuts)| {
                let body = mutate(seed.clone(), &ms);
                let decode = |chunks: &[&[u8]]| {
                    let mut decoder = dialect.stream_decoder();
                    let mut events = Vec::new();
                    for chunk in chunks {
                        events.extend(decoder.feed(chunk));
                    }
                    events.extend(decoder.flush());
                    (format!("{events:?}"), format!("{:?}", decoder.finish()))
                };
                let mut at: Vec<usize> = cuts
                    .iter()
                    .map(|f| (body.len() as f64 * f) as usize)
                    .collect();
                at.sort_unstable();
                let mut chunks = Vec::new();
                let mut from = 0;
                for cut in at.into_iter().chain([body.len()]) {
                    chunks.push(&body[from..cut]);
                    from = cut;
                }
                prop_assert_eq!(decode(&[&body]), decode(&chunks));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
