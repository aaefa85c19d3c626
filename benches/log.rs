//! The log's writer thread: what writing a request's rows costs, through the real `Store`
//! (its queue, its thread, a SQLite file in WAL mode), in batches the size a loaded proxy
//! gives it.
//!
//! - `log/request`: 256 request rows, then a flush (the writer's batch, one transaction);
//! - `log/request+finding`: the same with a finding per request, as every 209 KB request of
//!   the load harness has (goal drift, observe only).
//!
//! The time is the writer's: logging only queues, and the flush waits for the rows to be
//! written. `cargo bench --bench log`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use loopwarden::store::{FindingRow, Record, RequestRow, Store, StoreOptions};

/// Requests per flush: what the 50 ms batch window gathers at ~5 k requests per second;
/// with their findings, one batch of the default `store.batch_size` (512 entries).
const PER_FLUSH: i64 = 256;

const CONVERSATION: &str = "#head-0123456789abcdef0123456789abcdef";

fn request(id: i64) -> Record {
    Record::Request(Box::new(RequestRow {
        id,
        conversation_id: CONVERSATION.into(),
        started_ms: 1_760_000_000_000 + id,
        method: "POST".into(),
        path: "/v1/messages".into(),
        upstream: "anthropic".into(),
        dialect: Some("anthropic".into()),
        model: Some("claude-sonnet-4-5".into()),
        stream: false,
        parse: "parsed".into(),
        parse_error: None,
        steps: Some(39),
        decision: Some("observe".into()),
        applied: "forwarded".into(),
        status: 200,
        outcome: "complete".into(),
        request_bytes: 209_097,
        response_bytes: 612,
        upstream_latency_us: Some(310),
        upstream_total_us: Some(330),
        proxy_overhead_us: 41,
        body_read_us: Some(28),
        input_tokens: Some(51_234),
        output_tokens: Some(42),
        stop_reason: Some("tool_use".into()),
        policy: Some("default".into()),
        cached_input_tokens: Some(48_000),
        cache_write_tokens: Some(3_000),
        cost_usd: Some(0.0311),
        compaction: None,
        stated_id: None,
    }))
}

fn finding(request_id: i64) -> Record {
    Record::Finding(Box::new(FindingRow {
        request_id,
        conversation_id: CONVERSATION.into(),
        created_ms: 1_760_000_000_000 + request_id,
        detector: "goal_drift".into(),
        confidence: 0.4,
        step: Some(39),
        steps: "[30,31,32,33,34,35,36,37,38,39]".into(),
        summary: "the last 10 steps share 4% of their words with the task".into(),
        suggestion: "Restate the task and check the last steps against it.".into(),
    }))
}

fn log(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut group = c.benchmark_group("log");
    group.throughput(Throughput::Elements(PER_FLUSH as u64));
    for (name, with_finding) in [("request", false), ("request+finding", true)] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("log.db").display());
        let options = StoreOptions {
            queue_capacity: 4 * PER_FLUSH as usize,
            batch_size: 512,
            batch_window: StoreOptions::BATCH_WINDOW,
            retry_rows: 65_536,
        };
        let store = runtime
            .block_on(Store::open(&url, options))
            .expect("the log opens");
        let mut next_id = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    for _ in 0..PER_FLUSH {
                        next_id += 1;
                        store.log(request(next_id));
                        if with_finding {
                            store.log(finding(next_id));
                        }
                    }
                    runtime.block_on(store.flush());
                }
                started.elapsed()
            })
        });
        assert_eq!(store.health().dropped, 0, "the queue held every row");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = log
}
criterion_main!(benches);
