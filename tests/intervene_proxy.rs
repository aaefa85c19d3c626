//! Interventions through the real proxy over loopback sockets, in front of the scripted
//! mock: the nudge the upstream receives, the halt the client receives (every API, JSON
//! and SSE), sticky halts and both ways to resume, block, rollback, and the log.

mod intervene_support;

use intervene_support::*;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::{json, Value};

/// Where each API must carry the reminder: after everything the client sent.
fn reminder_of(dialect: Dialect, body: &Value) -> Option<String> {
    let text = match dialect {
        Dialect::OpenAiChat => {
            let last = body["messages"].as_array()?.last()?;
            (last["role"] == "system").then(|| last["content"].as_str().map(str::to_string))??
        }
        Dialect::OpenAiResponses => {
            let last = body["input"].as_array()?.last()?;
            (last["role"] == "developer")
                .then(|| last["content"][0]["text"].as_str().map(str::to_string))??
        }
        Dialect::Anthropic => {
            let last = body["messages"].as_array()?.last()?;
            if last["role"] != "user" {
                return None;
            }
            last["content"].as_array()?.last()?["text"]
                .as_str()?
                .to_string()
        }
        Dialect::Gemini => {
            let last = body["contents"].as_array()?.last()?;
            if last["role"] != "user" {
                return None;
            }
            last["parts"].as_array()?.last()?["text"]
                .as_str()?
                .to_string()
        }
    };
    Some(text)
}

#[tokio::test]
async fn the_nudge_reaches_the_upstream_after_everything_the_client_sent() {
    for dialect in ALL {
        let setup = Setup::start(looping_script(dialect), |_| {}).await;
        let k = first_k(dialect, Action::Nudge);
        let sent = loop_body(dialect, k, false, None);
        let resp = setup.post(&path(dialect, "nudge-me", false), &sent).await;
        assert_eq!(
            header(&resp, "x-loopwarden-decision"),
            "nudge",
            "{dialect:?}"
        );
        assert!(resp.status().is_success());
        let seen = setup.mock.requests();
        assert_eq!(seen.len(), 1, "{dialect:?}: forwarded once");
        let got = seen[0].json();
        let reminder = reminder_of(dialect, &got)
            .unwrap_or_else(|| panic!("{dialect:?}: no trailing reminder in {got}"));
        assert!(
            reminder.starts_with("[loopwarden]"),
            "{dialect:?}: {reminder}"
        );
        assert!(
            reminder.contains("Fix the failing test"),
            "{dialect:?}: the goal is in it"
        );
        // The request stays valid: it reads back with the same turns, every call paired.
        let before = dialect
            .parse_request(sent.to_string().as_bytes(), dialect == Dialect::Gemini)
            .unwrap();
        let after = dialect
            .parse_request(&seen[0].body, dialect == Dialect::Gemini)
            .unwrap();
        assert_eq!(
            after.transcript.steps.len(),
            before.transcript.steps.len(),
            "{dialect:?}"
        );
        assert!(after
            .transcript
            .steps
            .iter()
            .all(|s| s.calls.iter().all(|c| c.result.is_some())));
        // Everything the client sent comes first, byte for byte (the prompt cache holds).
        let original = sent.to_string();
        let prefix = &original[..original.len() - 8];
        let upstream = String::from_utf8(seen[0].body.to_vec()).unwrap();
        let common = original
            .bytes()
            .zip(upstream.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            common > prefix.len() / 2,
            "{dialect:?}: the history is not rewritten"
        );
    }
}

#[tokio::test]
async fn halts_are_complete_answers_in_each_api_and_mode_without_calling_the_upstream() {
    for dialect in ALL {
        for stream in [false, true] {
            let setup = Setup::start(looping_script(dialect), |_| {}).await;
            let k = first_k(dialect, Action::Halt);
            let resp = setup
                .post(
                    &path(dialect, "halt-me", stream),
                    &loop_body(dialect, k, stream, None),
                )
                .await;
            assert_eq!(resp.status().as_u16(), 200, "{dialect:?} stream={stream}");
            assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
            let content_type = header(&resp, "content-type");
            assert_eq!(
                content_type.starts_with("text/event-stream"),
                stream,
                "{dialect:?}: {content_type}"
            );
            let body = resp.bytes().await.unwrap();
            let (text, calls, ended) = read_answer(dialect, stream, &body);
            assert!(ended, "{dialect:?} stream={stream}: complete");
            assert!(calls.is_empty(), "{dialect:?}: a text halt");
            assert!(
                text.starts_with("[loopwarden] I stopped this run"),
                "{dialect:?}: {text}"
            );
            assert!(
                text.contains("/admin/api/conversations/halt-me/resume"),
                "says how to resume"
            );
            assert!(
                setup.mock.requests().is_empty(),
                "{dialect:?}: the upstream was not called"
            );
        }
    }
}

#[tokio::test]
async fn mini_swe_agent_is_halted_with_its_submit_command() {
    let dialect = Dialect::OpenAiChat;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    let k = first_k(dialect, Action::Halt);
    let mut body = loop_body(dialect, k, false, None);
    body.as_object_mut().unwrap().remove("stream");
    body["tools"] = json!([{"type": "function", "function": {"name": "bash", "parameters": {}}}]);
    let resp = client()
        .post(setup.url(&path(dialect, "mini", false)))
        .header("user-agent", "OpenAI/Python 2.54.0")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    let call = &answer["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "bash");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    let command = args["command"].as_str().unwrap();
    assert!(
        command.starts_with("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo '[loopwarden]"),
        "{command}"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn a_halt_sticks_until_a_human_speaks_or_an_operator_resumes() {
    let dialect = Dialect::Anthropic;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    let k = first_k(dialect, Action::Halt);
    let p = path(dialect, "sticky", true);
    let resp = setup.post(&p, &loop_body(dialect, k, true, None)).await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    let _ = resp.bytes().await;

    // The client tries again, with more history: halted again, upstream never called.
    for extra in [0, 1] {
        let resp = setup
            .post(&p, &loop_body(dialect, k + extra, true, None))
            .await;
        assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
        let (text, _, _) = read_answer(dialect, true, &resp.bytes().await.unwrap());
        assert!(text.starts_with("[loopwarden]"));
    }
    assert!(setup.mock.requests().is_empty());

    // A human writes: the conversation goes on.
    let human = loop_body(
        dialect,
        k + 1,
        true,
        Some("Try reading calc.py before running the test again."),
    );
    let resp = setup.post(&p, &human).await;
    assert_ne!(header(&resp, "x-loopwarden-decision"), "halt");
    let _ = resp.bytes().await;
    assert_eq!(setup.mock.requests().len(), 1);

    // An operator halts it by hand, then resumes it.
    let (status, v) = setup
        .admin(
            "/admin/api/conversations/sticky/halt",
            Some(json!({"reason": "checking the workspace"})),
        )
        .await;
    assert_eq!((status, v["halted"]["halted"].as_bool()), (200, Some(true)));
    let resp = setup.post(&p, &human).await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    let (text, _, _) = read_answer(dialect, true, &resp.bytes().await.unwrap());
    assert!(text.contains("checking the workspace"), "{text}");
    assert_eq!(setup.mock.requests().len(), 1);
    let (status, _) = setup
        .admin("/admin/api/conversations/sticky/resume", None)
        .await;
    assert_eq!(status, 200);
    let resp = setup.post(&p, &human).await;
    assert_ne!(header(&resp, "x-loopwarden-decision"), "halt");
    let _ = resp.bytes().await;
    assert_eq!(setup.mock.requests().len(), 2);

    // Every intervention is in the log with its source.
    setup.proxy.flush_log().await;
    let (_, timeline) = setup.admin("/admin/api/conversations/sticky", None).await;
    let sources: Vec<(String, String)> = timeline["interventions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["action"].as_str().unwrap().into(),
                i["source"].as_str().unwrap().into(),
            )
        })
        .collect();
    for want in [
        ("halt", "policy"),
        ("halt", "sticky"),
        ("resume", "human"),
        ("halt", "operator"),
        ("resume", "operator"),
    ] {
        assert!(
            sources.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} missing from {sources:?}"
        );
    }
}

#[tokio::test]
async fn a_halt_survives_a_restart() {
    let dialect = Dialect::OpenAiChat;
    let mock = loopwarden::mock::MockServer::start(looping_script(dialect))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = path(dialect, "restart", false);
    let body = loop_body(dialect, first_k(dialect, Action::Nudge), false, None);
    {
        let proxy = loopwarden::proxy::start(config(&mock, &dir, |_| {}))
            .await
            .unwrap();
        // The operator halts a conversation the proxy has seen (an unknown id is a 404).
        let first = loop_body(dialect, 1, false, None);
        let r = client()
            .post(format!("{}{p}", proxy.url()))
            .body(first.to_string())
            .send()
            .await
            .unwrap();
        let _ = r.bytes().await;
        proxy.flush_log().await;
        let (status, _) = {
            let r = client()
                .post(format!(
                    "{}/admin/api/conversations/restart/halt",
                    proxy.url()
                ))
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), ())
        };
        assert_eq!(status, 200);
        proxy.shutdown().await.unwrap();
    }
    let proxy = loopwarden::proxy::start(config(&mock, &dir, |_| {}))
        .await
        .unwrap();
    let resp = client()
        .post(format!("{}{p}", proxy.url()))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    let (text, _, _) = read_answer(dialect, false, &resp.bytes().await.unwrap());
    assert!(text.contains("An operator stopped this run"), "{text}");
    assert_eq!(mock.requests().len(), 1, "only the request before the halt");
    proxy.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_response_that_completes_the_loop_is_blocked_in_json_and_sse() {
    for dialect in ALL {
        let Some(k) = block_k(dialect) else {
            panic!("{dialect:?}: the default policy never blocks this loop");
        };
        for stream in [false, true] {
            let setup = Setup::start(looping_script(dialect), |_| {}).await;
            let resp = setup
                .post(
                    &path(dialect, "block-me", stream),
                    &loop_body(dialect, k, stream, None),
                )
                .await;
            assert_eq!(resp.status().as_u16(), 200);
            if !stream {
                assert_eq!(
                    header(&resp, "x-loopwarden-decision"),
                    "block",
                    "{dialect:?}"
                );
            }
            let body = resp.bytes().await.unwrap();
            let (text, calls, ended) = read_answer(dialect, stream, &body);
            assert_eq!(setup.mock.requests().len(), 1, "the upstream answered");
            assert!(
                calls.is_empty(),
                "{dialect:?} stream={stream}: the call never reaches the agent"
            );
            assert!(ended, "{dialect:?} stream={stream}: well-formed");
            assert!(
                text.contains("[loopwarden] I stopped this run"),
                "{dialect:?}: {text}"
            );
            if stream {
                assert!(
                    text.starts_with("Running the test again."),
                    "{dialect:?}: text delivered: {text}"
                );
            }
            setup.proxy.flush_log().await;
            let (_, timeline) = setup.admin("/admin/api/conversations/block-me", None).await;
            let logged: Vec<(&str, &str)> = timeline["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["action"].as_str().unwrap(),
                        d["applied"].as_str().unwrap(),
                    )
                })
                .collect();
            assert!(
                logged.contains(&("block", "blocked")),
                "{dialect:?}: {logged:?}"
            );
            // The conversation is halted from now on.
            let resp = setup
                .post(
                    &path(dialect, "block-me", stream),
                    &loop_body(dialect, k, stream, None),
                )
                .await;
            assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
            let _ = resp.bytes().await;
            assert_eq!(setup.mock.requests().len(), 1);
        }
    }
}

#[tokio::test]
async fn rollback_forwards_whole_pairs_replaced_by_a_note() {
    for dialect in ALL {
        let setup = Setup::start(looping_script(dialect), |config| {
            config.intervene.rollback = true;
            let engine = loopwarden::detect::Engine::default();
            for name in engine.detector_names() {
                let mut policy = config.detect.policy(name);
                policy.first_action = Action::Rollback;
                config.detect.patterns.insert(name.to_string(), policy);
            }
        })
        .await;
        let k = first_k(dialect, Action::Nudge);
        let sent = loop_body(dialect, k, false, None);
        let resp = setup.post(&path(dialect, "roll", false), &sent).await;
        assert_eq!(
            header(&resp, "x-loopwarden-decision"),
            "rollback",
            "{dialect:?}"
        );
        let _ = resp.bytes().await;
        let seen = setup.mock.requests();
        let after = dialect
            .parse_request(&seen[0].body, dialect == Dialect::Gemini)
            .unwrap()
            .transcript;
        assert!(
            after.steps.len() < k,
            "{dialect:?}: turns removed ({} of {k} left)",
            after.steps.len()
        );
        assert!(
            after
                .steps
                .iter()
                .all(|s| s.calls.iter().all(|c| c.result.is_some())),
            "{dialect:?}: no call without its result"
        );
        let upstream = String::from_utf8(seen[0].body.to_vec()).unwrap();
        assert!(
            upstream.contains("earlier turns were removed"),
            "{dialect:?}: the note is there"
        );
        assert!(
            upstream.contains(COMMAND),
            "{dialect:?}: the note says what was tried"
        );
    }
}

#[tokio::test]
async fn an_operator_resume_lets_the_very_same_request_through() {
    // The client retries the halted request unchanged; after a resume that same request
    // must reach the upstream (detection starts over there, whatever it cached).
    let dialect = Dialect::OpenAiChat;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    let p = path(dialect, "retry", false);
    let body = loop_body(dialect, first_k(dialect, Action::Halt), false, None);
    for _ in 0..2 {
        let resp = setup.post(&p, &body).await;
        assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
        let _ = resp.bytes().await;
    }
    assert!(setup.mock.requests().is_empty());
    let (status, _) = setup
        .admin("/admin/api/conversations/retry/resume", None)
        .await;
    assert_eq!(status, 200);
    let resp = setup.post(&p, &body).await;
    let decision = header(&resp, "x-loopwarden-decision");
    assert!(decision != "halt" && decision != "pause", "{decision}");
    let _ = resp.bytes().await;
    assert_eq!(setup.mock.requests().len(), 1);
}

#[tokio::test]
async fn a_gemini_stream_without_sse_is_halted_with_a_json_array() {
    let dialect = Dialect::Gemini;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    let body = loop_body(dialect, first_k(dialect, Action::Halt), true, None);
    let resp = setup
        .post("/c/array/v1beta/models/g:streamGenerateContent", &body)
        .await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    assert!(header(&resp, "content-type").starts_with("application/json"));
    let bytes = resp.bytes().await.unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(v.is_array(), "{v}");
    let (text, _, _) = read_answer(dialect, true, &bytes);
    assert!(text.starts_with("[loopwarden]"), "{text}");
    assert!(setup.mock.requests().is_empty());
}

#[tokio::test]
async fn without_the_opt_in_a_rollback_decision_is_a_replan_reminder() {
    let dialect = Dialect::OpenAiChat;
    let setup = Setup::start(looping_script(dialect), |config| {
        let engine = loopwarden::detect::Engine::default();
        for name in engine.detector_names() {
            let mut policy = config.detect.policy(name);
            policy.first_action = Action::Rollback;
            config.detect.patterns.insert(name.to_string(), policy);
        }
    })
    .await;
    let k = first_k(dialect, Action::Nudge);
    let sent = loop_body(dialect, k, false, None);
    let resp = setup.post(&path(dialect, "no-roll", false), &sent).await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "replan");
    let _ = resp.bytes().await;
    let got = setup.mock.requests()[0].json();
    let last = got["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "system");
    assert!(
        last["content"].as_str().unwrap().contains("replan"),
        "{last}"
    );
    let upstream_steps = dialect
        .parse_request(&setup.mock.requests()[0].body, false)
        .unwrap()
        .transcript
        .steps
        .len();
    assert_eq!(upstream_steps, k, "history untouched");
}

/// An agent that states no conversation id (mini-swe-agent without `/c/{id}`) is known by
/// its system prompt and task, so its next run of the same task has the same id. A halt
/// holds for the halted run only: the next run starts free, also after a restart, while
/// the halted run stays halted.
#[tokio::test]
async fn a_halt_does_not_leak_into_the_next_run_of_the_same_task() {
    let dialect = Dialect::OpenAiChat;
    let mock = loopwarden::mock::MockServer::start(looping_script(dialect))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let k = first_k(dialect, Action::Halt);
    let post = |proxy: &loopwarden::proxy::Running, body: Value| {
        let url = format!("{}/v1/chat/completions", proxy.url());
        async move {
            let resp = client()
                .post(url)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let decision = header(&resp, "x-loopwarden-decision");
            resp.bytes().await.unwrap();
            decision
        }
    };
    let proxy = loopwarden::proxy::start(config(&mock, &dir, |_| {}))
        .await
        .unwrap();
    assert_eq!(
        post(&proxy, loop_body(dialect, k, false, None)).await,
        "halt"
    );
    // Retried, the halted run is halted again (sticky).
    assert_eq!(
        post(&proxy, loop_body(dialect, k, false, None)).await,
        "halt"
    );
    let forwarded = mock.requests().len();
    // The next run of the same task: its first request, then a few steps in.
    assert_eq!(
        post(&proxy, loop_body(dialect, 0, false, None)).await,
        "observe"
    );
    assert_eq!(
        post(&proxy, loop_body(dialect, 1, false, None)).await,
        "observe"
    );
    assert_eq!(mock.requests().len(), forwarded + 2, "both forwarded");
    proxy.shutdown().await.unwrap();

    let proxy = loopwarden::proxy::start(config(&mock, &dir, |_| {}))
        .await
        .unwrap();
    assert_eq!(
        post(&proxy, loop_body(dialect, 0, false, None)).await,
        "observe"
    );
    assert_eq!(
        post(&proxy, loop_body(dialect, k, false, None)).await,
        "halt",
        "the halted run, after the restart"
    );
    proxy.shutdown().await.unwrap();
}
