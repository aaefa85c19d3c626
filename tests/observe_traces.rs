//! OpenTelemetry traces over real HTTP: a looping conversation through the proxy in front of
//! the mock, and an OTLP/HTTP receiver written here that gets the model-call spans with the
//! GenAI attributes, and the guardrail spans and events of the nudge and the halt, with no
//! prompt or tool content unless the policy logs content.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;

use std::sync::{Arc, Mutex};

use intervene_support::*;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::Value;

/// An OTLP/HTTP receiver: every export request's body, as JSON.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// Every span received, flattened out of the export requests.
fn spans(got: &Arc<Mutex<Vec<Value>>>) -> Vec<Value> {
    got.lock()
        .unwrap()
        .iter()
        .flat_map(|r| r["resourceSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|rs| rs["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attr<'a>(attributes: &'a Value, key: &str) -> Option<&'a Value> {
    attributes
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn text<'a>(attributes: &'a Value, key: &str) -> &'a str {
    attr(attributes, key)
        .and_then(|v| v["stringValue"].as_str())
        .unwrap_or("")
}

/// Runs the looping conversation to its halt; the spans received.
async fn run(content: bool) -> (Vec<Value>, String) {
    let dialect = Dialect::Anthropic;
    let (url, got) = receiver().await;
    let setup = Setup::start(looping_script(dialect), |c| {
        c.telemetry.otlp_endpoint = url.clone();
        c.telemetry.flush_ms = 20;
        c.log.content = content;
    })
    .await;
    let halt = first_k(dialect, Action::Halt);
    for k in 1..=halt {
        let r = setup
            .post(
                &path(dialect, "traced", false),
                &loop_body(dialect, k, false, None),
            )
            .await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let mut all = Vec::new();
    for _ in 0..200 {
        all = spans(&got);
        let guardrails = all
            .iter()
            .filter(|s| s["name"] == "apply_guardrail loopwarden");
        if guardrails
            .filter(|s| text(&s["attributes"], "gen_ai.security.decision.type") == "deny")
            .count()
            > 0
            && all.len() >= halt
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let raw = serde_json::to_string(&got.lock().unwrap().clone()).unwrap();
    (all, raw)
}

#[tokio::test]
async fn each_model_call_is_a_span_and_each_intervention_a_guardrail_result() {
    let (spans, raw) = run(false).await;
    let calls: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 3).collect();
    let halt = first_k(Dialect::Anthropic, Action::Halt);
    assert_eq!(calls.len(), halt, "one span per request: {raw}");
    for call in &calls {
        let a = &call["attributes"];
        assert_eq!(text(a, "gen_ai.operation.name"), "chat");
        assert_eq!(text(a, "gen_ai.provider.name"), "anthropic");
        assert_eq!(text(a, "gen_ai.request.model"), "claude-test");
        assert_eq!(text(a, "gen_ai.conversation.id"), "traced");
        assert_eq!(call["name"], "chat claude-test");
        assert_eq!(call["traceId"].as_str().unwrap().len(), 32);
    }
    // The forwarded calls report the mock's usage.
    let forwarded: Vec<&&Value> = calls
        .iter()
        .filter(|c| text(&c["attributes"], "loopwarden.applied") != "halted")
        .collect();
    assert!(forwarded
        .iter()
        .all(|c| attr(&c["attributes"], "gen_ai.usage.output_tokens").is_some()));
    // ... and why each answer ended, as the README lists it: the mock's tool calls, or
    // the end of the halt that replaced a blocked answer.
    for call in &forwarded {
        let reasons = attr(&call["attributes"], "gen_ai.response.finish_reasons")
            .unwrap_or_else(|| panic!("no finish reasons: {call}"));
        let reason = &reasons["arrayValue"]["values"][0]["stringValue"];
        let blocked = text(&call["attributes"], "loopwarden.applied") == "blocked";
        let expected = if blocked { "end_turn" } else { "tool_use" };
        assert_eq!(reason, expected, "{call}");
    }

    let guardrails: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "apply_guardrail loopwarden")
        .collect();
    let decided = |kind: &str| {
        guardrails
            .iter()
            .find(|g| text(&g["attributes"], "gen_ai.security.decision.type") == kind)
            .copied()
    };
    let nudge = decided("modify").expect("the nudge's guardrail span");
    let halt_span = decided("deny").expect("the halt's guardrail span");
    // The stop is the halt of a request, or the block of the answer that completes the loop.
    for (g, results) in [
        (nudge, &["nudged"][..]),
        (halt_span, &["halted", "blocked"]),
    ] {
        let a = &g["attributes"];
        assert_eq!(text(a, "gen_ai.operation.name"), "apply_guardrail");
        assert_eq!(text(a, "loopwarden.policy"), "default");
        let parent = calls
            .iter()
            .find(|c| c["spanId"] == g["parentSpanId"])
            .expect("a child of its model call");
        assert_eq!(parent["traceId"], g["traceId"]);
        let event = &g["events"][0];
        assert_eq!(event["name"], "gen_ai.guardrail.result");
        let e = &event["attributes"];
        assert_eq!(text(e, "gen_ai.guardrail.policy"), "default");
        assert!(results.contains(&text(e, "gen_ai.guardrail.result")), "{g}");
        assert_eq!(
            text(e, "gen_ai.guardrail.reason"),
            "fail_loop",
            "the detector alone"
        );
    }
    // No prompt, no tool argument, no tool output.
    for secret in [
        "Fix the failing test",
        "python3 test_calc.py",
        "AssertionError",
        "coding agent",
    ] {
        assert!(!raw.contains(secret), "{secret:?} exported: {raw}");
    }
}

#[tokio::test]
async fn a_policy_that_logs_content_exports_the_reason() {
    let (spans, _) = run(true).await;
    let halt = spans
        .iter()
        .filter(|s| s["name"] == "apply_guardrail loopwarden")
        .find(|g| text(&g["attributes"], "gen_ai.security.decision.type") == "deny")
        .expect("the halt's guardrail span");
    let reason = text(&halt["events"][0]["attributes"], "gen_ai.guardrail.reason");
    assert!(reason.contains("python3 test_calc.py"), "{reason}");
}
