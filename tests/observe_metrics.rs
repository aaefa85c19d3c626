//! `GET /metrics` after a scripted run through the proxy (the scripted mock upstream, a
//! looping agent nudged then halted, a sticky halt, a forwarded non-conversation call): the
//! answer parses as Prometheus text exposition, and its counters say what the log says.

mod intervene_support;
mod proxy_support;

use std::collections::BTreeMap;

use intervene_support::*;
use loopwarden::budget::{Price, Prices};
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::Value;

/// One sample: its name, its labels (sorted) and its value.
type Key = (String, BTreeMap<String, String>);

/// A small parser of the text exposition format (Prometheus 0.0.4 and OpenMetrics 1.0):
/// `# HELP`/`# TYPE`/`# UNIT` comments, `name{label="value",...} value` samples, `# EOF`.
/// Panics at whatever the format does not allow: every sample's family declared by a
/// `# TYPE` before it, label values quoted and escaped, values numbers, one `# EOF` last.
fn parse(text: &str) -> BTreeMap<Key, f64> {
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut ended = false;
    for line in text.lines() {
        assert!(!ended, "nothing after # EOF: {line}");
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(valid_name(name), "metric name {name}");
            match kind {
                "TYPE" => {
                    let t = parts.next().unwrap();
                    assert!(
                        [
                            "counter",
                            "gauge",
                            "histogram",
                            "summary",
                            "unknown",
                            "info"
                        ]
                        .contains(&t),
                        "{line}"
                    );
                    typed.insert(name.to_string(), t.to_string());
                }
                "HELP" | "UNIT" => {}
                other => panic!("unknown comment {other}: {line}"),
            }
            continue;
        }
        let (name, rest) = line.split_at(
            line.find(['{', ' '])
                .unwrap_or_else(|| panic!("no value: {line}")),
        );
        assert!(valid_name(name), "{line}");
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => labels_of(rest, line),
            None => (BTreeMap::new(), rest),
        };
        let value = value.trim().split(' ').next().unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value {v} in {line}")),
        };
        let family = ["_total", "_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains_key(*f)))
            .unwrap_or(name);
        assert!(typed.contains_key(family), "no # TYPE for {name}");
        samples.insert((name.to_string(), labels), value);
    }
    assert!(ended, "the exposition ends with # EOF");
    samples
}

/// `label="value",...}` and what follows the closing brace.
fn labels_of<'a>(rest: &'a str, line: &str) -> (BTreeMap<String, String>, &'a str) {
    let bytes = rest.as_bytes();
    let mut labels = BTreeMap::new();
    let mut i = 0;
    loop {
        let eq = i + rest[i..].find("=\"").unwrap_or_else(|| panic!("{line}"));
        let label = &rest[i..eq];
        assert!(
            valid_name(label) && !label.contains(':'),
            "label {label} in {line}"
        );
        let mut value = String::new();
        i = eq + 2;
        while bytes[i] != b'"' {
            if bytes[i] == b'\\' {
                i += 1;
                value.push(match bytes[i] {
                    b'n' => '\n',
                    b'"' => '"',
                    b'\\' => '\\',
                    other => panic!("escape \\{} in {line}", other as char),
                });
            } else {
                value.push(bytes[i] as char);
            }
            i += 1;
        }
        labels.insert(label.to_string(), value);
        match bytes[i + 1] {
            b',' => i += 2,
            b'}' => return (labels, &rest[i + 2..]),
            other => panic!("{} after a label value in {line}", other as char),
        }
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// The samples of `name`, summed over the labels not in `by`, keyed by the values of `by`.
fn by(samples: &BTreeMap<Key, f64>, name: &str, by: &[&str]) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for ((n, labels), v) in samples {
        if n == name {
            let key = by.iter().map(|l| labels[*l].clone()).collect();
            *out.entry(key).or_insert(0.0) += v;
        }
    }
    out
}

/// The same grouping, from the log.
fn grouped(rows: &[Value], by: &[&str]) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for row in rows {
        let key = by
            .iter()
            .map(|c| match &row[*c] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect();
        *out.entry(key).or_insert(0.0) += row["n"].as_f64().unwrap();
    }
    out
}

async fn log_rows(setup: &Setup, sql: &str) -> Vec<Value> {
    setup.proxy.flush_log().await;
    let url = format!("sqlite://{}", setup.dir.path().join("log.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let rows = proxy_support::query_json(&pool, sql).await;
    pool.close().await;
    rows
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_count_what_the_log_holds() {
    let dialect = Dialect::Anthropic;
    let setup = Setup::start(looping_script(dialect), |c| {
        c.prices = Prices::new(vec![(
            "claude-test".into(),
            Price {
                input: 1.0,
                cached_input: 0.1,
                cache_write: 1.25,
                output: 5.0,
            },
        )]);
    })
    .await;
    let halt_at = first_k(dialect, Action::Halt);
    // The agent's run: each request one more failing test, streamed every other time,
    // until the halt; then once more (the sticky halt), and a call that is no conversation.
    for k in 1..=halt_at + 1 {
        let stream = k % 2 == 0;
        let resp = setup
            .post(
                &path(dialect, "metrics-run", stream),
                &loop_body(dialect, k.min(halt_at), stream, None),
            )
            .await;
        assert_eq!(resp.status().as_u16(), 200);
        resp.bytes().await.unwrap();
    }
    let resp = client().get(setup.url("/v1/models")).send().await.unwrap();
    resp.bytes().await.unwrap();
    setup.proxy.flush_log().await;

    let resp = client().get(setup.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(header(&resp, "content-type").starts_with("application/openmetrics-text"));
    let samples = parse(&resp.text().await.unwrap());

    let requests = log_rows(
        &setup,
        "SELECT coalesce(dialect, 'other') AS api, status, count(*) AS n FROM requests GROUP BY 1, 2",
    )
    .await;
    assert!(requests.len() >= 2, "conversation calls and the model list");
    assert_eq!(
        by(&samples, "loopwarden_requests_total", &["api", "status"]),
        grouped(&requests, &["api", "status"])
    );
    let total: f64 = grouped(&requests, &[]).values().sum();
    assert_eq!(
        samples[&(
            "loopwarden_proxy_overhead_seconds_count".into(),
            BTreeMap::new()
        )],
        total
    );
    let forwarded = log_rows(
        &setup,
        "SELECT count(*) AS n FROM requests WHERE upstream_latency_us IS NOT NULL",
    )
    .await;
    assert_eq!(
        samples[&(
            "loopwarden_upstream_time_to_first_byte_seconds_count".into(),
            BTreeMap::new()
        )],
        forwarded[0]["n"].as_f64().unwrap()
    );

    let decisions = log_rows(
        &setup,
        "SELECT action, applied, policy, count(*) AS n FROM decisions GROUP BY 1, 2, 3",
    )
    .await;
    let logged = grouped(&decisions, &["action", "applied", "policy"]);
    assert!(
        logged.keys().any(|k| k[0] == "nudge") && logged.keys().any(|k| k[0] == "halt"),
        "the run was nudged and halted: {logged:?}"
    );
    assert_eq!(
        by(
            &samples,
            "loopwarden_decisions_total",
            &["action", "applied", "policy"]
        ),
        logged
    );
    let interventions = log_rows(
        &setup,
        "SELECT action, applied, detector, coalesce(policy, '') AS policy, count(*) AS n \
         FROM interventions GROUP BY 1, 2, 3, 4",
    )
    .await;
    assert_eq!(
        by(
            &samples,
            "loopwarden_interventions_total",
            &["action", "applied", "detector", "policy"]
        ),
        grouped(&interventions, &["action", "applied", "detector", "policy"])
    );

    let spend = log_rows(
        &setup,
        "SELECT sum(input_tokens) AS input, sum(cached_input_tokens) AS cached_input, \
         sum(cache_write_tokens) AS cache_write, sum(output_tokens) AS output, \
         sum(cost_usd) AS cost FROM requests",
    )
    .await;
    let tokens = by(&samples, "loopwarden_tokens_total", &["kind"]);
    for kind in ["input", "output"] {
        let logged = spend[0][kind].as_f64().unwrap();
        assert!(logged > 0.0, "{kind}");
        assert_eq!(tokens[&vec![kind.to_string()]], logged, "{kind}");
    }
    let cost = by(&samples, "loopwarden_cost_usd_total", &["policy"]);
    let logged = spend[0]["cost"].as_f64().unwrap();
    assert!(logged > 0.0);
    assert!((cost[&vec!["default".to_string()]] - logged).abs() < 1e-9);

    // States: the run is still held in memory; nothing is held for a human or queued.
    let state = |name: &str| samples[&(name.to_string(), BTreeMap::new())];
    assert_eq!(state("loopwarden_live_conversations"), 1.0);
    assert_eq!(state("loopwarden_held_requests"), 0.0);
    assert_eq!(state("loopwarden_log_queue_depth"), 0.0);
    assert_eq!(state("loopwarden_log_dropped_total"), 0.0);
}

#[tokio::test]
async fn metrics_take_their_own_token_when_one_is_set() {
    let setup = Setup::start(looping_script(Dialect::Anthropic), |c| {
        c.admin.token = "admin-secret".into();
        c.metrics.token = "scrape-secret".into();
    })
    .await;
    let get = |token: Option<&str>| {
        let mut request = client().get(setup.url("/metrics"));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        request.send()
    };
    assert_eq!(get(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(
        get(Some("admin-secret")).await.unwrap().status().as_u16(),
        401
    );
    let resp = get(Some("scrape-secret")).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().ends_with("# EOF\n"));
    // The admin API keeps its own token.
    let admin = client()
        .get(setup.url("/admin/api/stats"))
        .bearer_auth("scrape-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status().as_u16(), 401);
}
