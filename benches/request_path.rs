//! What the proxy does to a request before forwarding it, on 8.8 KB / 209 KB / 2 MB agent
//! conversations in OpenAI and Anthropic shapes:
//!
//! - `parse_cold`: find the messages (`Dialect::view`) and parse every one of them;
//! - `parse_warm`: the same through the per-message cache, every message already known
//!   (each later request of a conversation: only hashing and lookups);
//! - `request`: the whole per-request path as `proxy::forward` runs it: identity, view,
//!   cached parse, transcript, detection decision from the conversation's cached engine
//!   state (`request/warm`), or for a conversation seen for the first time (`request/cold`);
//! - `growth`: request 30 and request 300 of one conversation, each after its predecessor
//!   (so only the newest turn is new), beside `read_bytes` (the scan of the same body):
//!   what the request costs beyond reading its bytes should not grow with the history.
//!
//! `cargo bench --bench request_path` (add `-- growth` etc. to pick a group).

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use http::HeaderMap;

use loopwarden::proxy::memory::MessageCache;

use support::{Agent, Proxy, Shape, SIZES};

const SHAPES: [Shape; 2] = [Shape::OpenAi, Shape::Anthropic];

fn payloads() -> Vec<(Shape, &'static str, bytes::Bytes)> {
    let mut out = Vec::new();
    for shape in SHAPES {
        for (label, size) in SIZES {
            out.push((shape, label, support::payload(shape, size)));
        }
    }
    out
}

fn parse(c: &mut Criterion) {
    let payloads = payloads();
    let mut cold = c.benchmark_group("parse_cold");
    for (shape, label, body) in &payloads {
        let dialect = shape.dialect();
        cold.throughput(Throughput::Bytes(body.len() as u64));
        cold.bench_with_input(BenchmarkId::new(shape.name(), label), body, |b, body| {
            b.iter(|| {
                let view = dialect.view(black_box(body), false).unwrap();
                let items: usize = view
                    .messages
                    .iter()
                    .map(|m| dialect.parse_message(m.get()).len())
                    .sum();
                black_box(items)
            })
        });
    }
    cold.finish();

    let mut warm = c.benchmark_group("parse_warm");
    for (shape, label, body) in &payloads {
        let dialect = shape.dialect();
        let cache = MessageCache::new(1 << 30, Duration::from_secs(3600));
        cache.items(
            dialect,
            &dialect.view(body, false).unwrap().messages,
            None,
            0,
        );
        warm.throughput(Throughput::Bytes(body.len() as u64));
        warm.bench_with_input(BenchmarkId::new(shape.name(), label), body, |b, body| {
            b.iter(|| {
                let view = dialect.view(black_box(body), false).unwrap();
                black_box(cache.items(dialect, &view.messages, None, 0).len())
            })
        });
    }
    warm.finish();
}

fn request(c: &mut Criterion) {
    let payloads = payloads();
    let headers = HeaderMap::new();
    let mut group = c.benchmark_group("request");
    for (shape, label, body) in &payloads {
        let dialect = shape.dialect();
        group.throughput(Throughput::Bytes(body.len() as u64));
        // Steady state: the conversation's messages and engine state are cached (what the
        // load harness measures, since it sends the same conversation again and again).
        let mut proxy = Proxy::new();
        proxy.analyse(dialect, &headers, body);
        group.bench_with_input(
            BenchmarkId::new(format!("warm/{}", shape.name()), label),
            body,
            |b, body| b.iter(|| black_box(proxy.analyse(dialect, &headers, black_box(body)))),
        );
        // First sight of a conversation: every message parsed, every step folded.
        group.bench_with_input(
            BenchmarkId::new(format!("cold/{}", shape.name()), label),
            body,
            |b, body| {
                b.iter_batched(
                    Proxy::new,
                    |mut proxy| {
                        // The proxy is returned so that dropping it is not timed.
                        let decision = proxy.analyse(dialect, &headers, black_box(body));
                        (proxy, decision)
                    },
                    BatchSize::PerIteration,
                )
            },
        );
    }
    group.finish();
}

/// Request `k` of a conversation after request `k - 1` went through: a proxy that has seen
/// the history but not the newest turn.
fn growth(c: &mut Criterion) {
    // An agent that names its conversation, as Claude Code, Codex and opencode do.
    let headers = support::stated_headers();
    let mut group = c.benchmark_group("growth");
    group.sample_size(30);
    for shape in SHAPES {
        let dialect = shape.dialect();
        let mut agent = Agent::new(7);
        let turns: Vec<_> = (0..300).map(|_| agent.turn(false)).collect();
        for k in [30usize, 300] {
            let before = support::render(shape, &turns[..k - 1], false);
            let body = support::render(shape, &turns[..k], false);
            let primed = || {
                let mut proxy = Proxy::new();
                proxy.analyse(dialect, &headers, &before);
                proxy
            };
            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_function(
                BenchmarkId::new(format!("{}/request", shape.name()), k),
                |b| {
                    b.iter_batched(
                        primed,
                        |mut proxy| {
                            let decision = proxy.analyse(dialect, &headers, black_box(&body));
                            (proxy, decision)
                        },
                        BatchSize::PerIteration,
                    )
                },
            );
            // Reading the bytes: the scan that finds the messages (UTF-8 check included),
            // which touches every byte and so grows with the body by nature.
            group.bench_function(
                BenchmarkId::new(format!("{}/read_bytes", shape.name()), k),
                |b| {
                    b.iter(|| {
                        let view = dialect.view(black_box(&body), false).unwrap();
                        black_box(view.messages.len())
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = parse, request, growth
}
criterion_main!(benches);
