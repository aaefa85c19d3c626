//! What conversations spend, over real HTTP: answers of the four APIs, streamed and not,
//! with cache reads and writes in their usage, go through the proxy to the mock; the admin
//! API's totals are the scripted usage priced at the providers' list prices, and a restart
//! finds them again in the log.

mod proxy_support;

use loopwarden::budget::Usage;
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, Api, Backend, TestProxy, ALL_APIS};
use serde_json::{json, Value};

/// What each turn of the script reports.
const TURNS: [Usage; 3] = [
    Usage {
        input: 1_200,
        cached_input: 0,
        cache_write: 3_000,
        output: 80,
    },
    Usage {
        input: 150,
        cached_input: 4_200,
        cache_write: 0,
        output: 120,
    },
    Usage {
        input: 90,
        cached_input: 4_400,
        cache_write: 300,
        output: 40,
    },
];

fn script() -> Script {
    let call = |command: &str| ToolCall::function("bash", json!({ "command": command }));
    let turn = |usage: Usage, calls: Vec<ToolCall>, text: &str| Turn {
        text: Some(text.into()),
        tool_calls: calls,
        usage: Some(usage),
        ..Turn::default()
    };
    Script {
        turns: vec![
            turn(TURNS[0], vec![call("ls")], "Looking."),
            turn(TURNS[1], vec![call("cat a.py")], "Reading."),
            turn(TURNS[2], Vec::new(), "Done."),
        ],
        ..Script::default()
    }
}

/// The list prices per million tokens (input, cached input, cache write, output) of the
/// models the test bodies name, written out here so the test does not read them from the
/// code it checks.
fn list_price(api: Api) -> [f64; 4] {
    match api {
        Api::Chat | Api::Responses => [5.0, 0.5, 5.0, 30.0], // gpt-5.5
        Api::Anthropic => [4.0, 0.2, 5.0, 20.0],             // claude-opus-5-5
        Api::Gemini => [0.75, 0.075, 0.75, 3.75],            // gemini-3.8-flash
    }
}

/// The usage the proxy must count for a scripted one: OpenAI and Gemini bill no cache
/// writes, so the mock reports a scripted write as ordinary input there.
fn counted(api: Api, u: Usage) -> Usage {
    match api {
        Api::Anthropic => u,
        _ => Usage {
            input: u.input + u.cache_write,
            cache_write: 0,
            ..u
        },
    }
}

fn dollars(api: Api, u: &Usage) -> f64 {
    let [i, c, w, o] = list_price(api);
    (u.input as f64 * i
        + u.cached_input as f64 * c
        + u.cache_write as f64 * w
        + u.output as f64 * o)
        / 1e6
}

fn expected(api: Api) -> (Usage, f64) {
    let mut total = Usage::default();
    let mut cost = 0.0;
    for u in TURNS {
        let u = counted(api, u);
        total.add(&u);
        cost += dollars(api, &u);
    }
    (total, cost)
}

fn conversation_id(api: Api, stream: bool) -> String {
    format!("spend-{api:?}-{}", if stream { "sse" } else { "json" }).to_lowercase()
}

/// Runs the three turns of one conversation through the proxy.
async fn run(proxy: &TestProxy, api: Api, stream: bool) {
    let id = conversation_id(api, stream);
    let done = [("ls", "a.py"), ("cat a.py", "print(1)")];
    for k in 0..3 {
        let body = api.request("Fix the bug.", stream, &done[..k]);
        let (name, value) = api.auth("sk-test-key-000");
        let r = client()
            .post(proxy.url(&format!("/c/{id}{}", api.path(stream))))
            .header(name, value)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{id} turn {k}");
        let answer = r.text().await.unwrap();
        assert!(!answer.is_empty(), "{id} turn {k}");
    }
}

async fn get(proxy: &TestProxy, path: &str) -> Value {
    let r = client().get(proxy.url(path)).send().await.unwrap();
    assert_eq!(r.status(), 200, "{path}");
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

fn assert_close(got: &Value, want: f64, what: &str) {
    let got = got.as_f64().unwrap_or(f64::NAN);
    assert!((got - want).abs() < 1e-9, "{what}: {got} != {want}");
}

fn assert_spend(entry: &Value, api: Api, what: &str) {
    let (usage, cost) = expected(api);
    assert_eq!(entry["requests"], 3, "{what}");
    assert_eq!(entry["steps"], 3, "{what}");
    assert_eq!(entry["input"], usage.input, "{what}");
    assert_eq!(entry["cached_input"], usage.cached_input, "{what}");
    assert_eq!(entry["cache_write"], usage.cache_write, "{what}");
    assert_eq!(entry["output"], usage.output, "{what}");
    assert_eq!(
        (&entry["unpriced"], &entry["unreported"]),
        (&json!(0), &json!(0)),
        "{what}"
    );
    assert_eq!(entry["policy"], "default", "{what}");
    assert_close(&entry["dollars"], cost, what);
}

fn find<'a>(spend: &'a Value, id: &str) -> &'a Value {
    spend["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in {spend}"))
}

on_both_backends!(
    the_admin_api_totals_are_the_usage_of_every_api_at_list_prices_and_survive_a_restart,
    an_unpriced_model_costs_nothing_and_a_stream_without_usage_is_marked,
);

async fn the_admin_api_totals_are_the_usage_of_every_api_at_list_prices_and_survive_a_restart(
    backend: Backend,
) {
    let mock = MockServer::start(script()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    for api in ALL_APIS {
        for stream in [false, true] {
            run(&proxy, api, stream).await;
        }
    }

    let spend = get(&proxy, "/admin/api/spend").await;
    let mut all_dollars = 0.0;
    let mut all = Usage::default();
    for api in ALL_APIS {
        for stream in [false, true] {
            let id = conversation_id(api, stream);
            assert_spend(find(&spend, &id), api, &id);
            let (usage, cost) = expected(api);
            all.add(&usage);
            all_dollars += cost;
        }
    }
    // One policy so far: everything is `default`'s.
    let policies = spend["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 1, "{spend}");
    let default = &policies[0];
    assert_eq!(default["policy"], "default");
    assert_eq!(default["conversations"], 8);
    assert_eq!(default["requests"], 24);
    assert_eq!(default["input"], all.input);
    assert_eq!(default["cached_input"], all.cached_input);
    assert_eq!(default["cache_write"], all.cache_write);
    assert_eq!(default["output"], all.output);
    assert_close(&default["dollars"], all_dollars, "default policy");
    // Newest first.
    let last: Vec<i64> = spend["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["last_ms"].as_i64().unwrap())
        .collect();
    assert!(last.windows(2).all(|w| w[0] >= w[1]), "{last:?}");

    // One conversation's spend, with its timeline (from the log: written out first). The
    // spend above needed no such wait: the ledger is charged as each answer ends.
    proxy.running.flush_log().await;
    let id = conversation_id(Api::Anthropic, true);
    let one = get(&proxy, &format!("/admin/api/conversations/{id}")).await;
    assert_spend(&one["spend"], Api::Anthropic, "timeline");
    assert_eq!(one["requests"].as_array().unwrap().len(), 3);

    // The log holds each answer's usage and cost: the same totals.
    let rows = proxy
        .rows(&format!(
            "SELECT CAST(sum(input_tokens) AS BIGINT) AS input,
                    CAST(sum(cached_input_tokens) AS BIGINT) AS cached,
                    CAST(sum(cache_write_tokens) AS BIGINT) AS write,
                    CAST(sum(output_tokens) AS BIGINT) AS output, sum(cost_usd) AS dollars
             FROM requests WHERE conversation_id = '{id}'"
        ))
        .await;
    let (usage, cost) = expected(Api::Anthropic);
    assert_eq!(
        (
            &rows[0]["input"],
            &rows[0]["cached"],
            &rows[0]["write"],
            &rows[0]["output"]
        ),
        (
            &json!(usage.input),
            &json!(usage.cached_input),
            &json!(usage.cache_write),
            &json!(usage.output)
        )
    );
    assert_close(&rows[0]["dollars"], cost, "logged cost");

    // A restart on the same log: the spend is read back, budgets do not start over.
    let again = proxy.restart(&mock.url()).await;
    let spend = get(&again, "/admin/api/spend").await;
    for api in ALL_APIS {
        for stream in [false, true] {
            let id = conversation_id(api, stream);
            assert_spend(find(&spend, &id), api, &format!("{id} after a restart"));
        }
    }
}

/// A model without a price: its tokens are counted, its answers cost 0 and say so; an
/// OpenAI Chat stream asked without `include_usage` reports nothing, which is said too.
async fn an_unpriced_model_costs_nothing_and_a_stream_without_usage_is_marked(backend: Backend) {
    let mock = MockServer::start(script()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    let post = |id: &str, body: Value| {
        client()
            .post(proxy.url(&format!("/c/{id}/v1/chat/completions")))
            .header("authorization", "Bearer sk-test")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let mut body = Api::Chat.first_request("Fix the bug.", false);
    body["model"] = json!("mock-model");
    post("unpriced", body).await.unwrap().text().await.unwrap();
    let mut body = Api::Chat.first_request("Fix the bug.", true);
    body.as_object_mut().unwrap().remove("stream_options");
    post("silent", body).await.unwrap().text().await.unwrap();

    let spend = get(&proxy, "/admin/api/spend").await;
    let unpriced = find(&spend, "unpriced");
    assert_eq!(
        (&unpriced["unpriced"], &unpriced["dollars"]),
        (&json!(1), &json!(0.0))
    );
    assert_eq!(unpriced["input"], TURNS[0].input + TURNS[0].cache_write);
    let silent = find(&spend, "silent");
    assert_eq!(
        (&silent["unreported"], &silent["output"]),
        (&json!(1), &json!(0))
    );
    let rows = proxy
        .rows(
            "SELECT conversation_id, input_tokens, cost_usd FROM requests ORDER BY conversation_id",
        )
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"conversation_id": "silent", "input_tokens": null, "cost_usd": null}),
            json!({"conversation_id": "unpriced", "input_tokens": 4200, "cost_usd": null}),
        ]
    );
}
