//! The dashboard at `/ui` in a real headless Chromium (driven over WebDriver:
//! `ui_support`), with live traffic from the scripted mock through the proxy: each page
//! shows the right rows, its buttons change the log and what the conversation's next
//! request gets, a page of another origin cannot act, and without the token a client
//! that is not on this machine gets nothing. Screenshots of each page are saved
//! (`ui_support::screenshot_dir`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod ui_support;

use std::net::IpAddr;
use std::sync::Arc;

use intervene_support::{client, first_k, header, loop_body, looping_script, Setup};
use loopwarden::config::{Config, TeamToken};
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::mock::MockServer;
use serde_json::Value;
use ui_support::Browser;

const DIALECT: Dialect = Dialect::OpenAiChat;

/// CI's runs stop on a loop; team `ask` waits for a human instead; team `trial`'s runs are
/// watched in shadow.
const POLICIES: &str = r#"
[[policy]]
name = "ask"
match = { team = "ask" }
[policy.intervene]
on_stop = "pause"
[policy.intervene.pause]
timeout_secs = 600

[[policy]]
name = "ci"
match = { team = "ci" }

[[policy]]
name = "trial"
mode = "shadow"
match = { team = "trial" }
"#;

async fn start(listen: &str, token: &str) -> Setup {
    start_with(listen, token, |_| {}).await
}

/// [`start`], with `adjust` applied to the config last.
async fn start_with(listen: &str, token: &str, adjust: impl FnOnce(&mut Config)) -> Setup {
    let mock = MockServer::start(looping_script(DIALECT)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config: Config = toml::from_str(POLICIES).unwrap();
    config.server.listen = listen.into();
    config.store.db = format!("sqlite://{}", dir.path().join("log.db").display());
    config.upstream.openai = mock.url();
    config.upstream.anthropic = mock.url();
    config.upstream.gemini = mock.url();
    config.admin.token = token.into();
    adjust(&mut config);
    let proxy = loopwarden::proxy::start(config).await.unwrap();
    Setup { mock, proxy, dir }
}

fn path(team: &str, conversation: &str) -> String {
    format!("/t/{team}/c/{conversation}/v1/chat/completions")
}

/// Sends the loop's request with `k` failing runs; the decision the answer carries.
async fn send(setup: &Setup, team: &str, conversation: &str, k: usize) -> String {
    let r = setup
        .post(
            &path(team, conversation),
            &loop_body(DIALECT, k, false, None),
        )
        .await;
    let decision = header(&r, "x-loopwarden-decision");
    r.bytes().await.unwrap();
    decision
}

/// The log's rows, read from the database file.
fn query(setup: &Setup, sql: &str) -> Vec<Vec<Value>> {
    let db = rusqlite::Connection::open(setup.dir.path().join("log.db")).unwrap();
    let mut statement = db.prepare(sql).unwrap();
    let n = statement.column_count();
    let rows = statement
        .query_map([], |row| {
            (0..n)
                .map(|i| {
                    Ok(match row.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => Value::Null,
                        rusqlite::types::ValueRef::Integer(v) => v.into(),
                        rusqlite::types::ValueRef::Real(v) => v.into(),
                        rusqlite::types::ValueRef::Text(t) => {
                            String::from_utf8_lossy(t).into_owned().into()
                        }
                        rusqlite::types::ValueRef::Blob(_) => Value::Null,
                    })
                })
                .collect()
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

async fn halted(setup: &Setup, id: &str) -> bool {
    setup.proxy.flush_log().await;
    let (_, v) = setup
        .admin(&format!("/admin/api/conversations/{id}"), None)
        .await;
    v["halted"] == true
}

/// The precision line of `detector` in `GET /admin/api/stats`: (right, wrong, implied).
async fn precision(setup: &Setup, detector: &str) -> Option<(i64, i64, i64)> {
    let (_, stats) = setup.admin("/admin/api/stats", None).await;
    stats["precision"].as_array()?.iter().find_map(|p| {
        (p["detector"] == detector).then(|| {
            (
                p["right"].as_i64().unwrap(),
                p["wrong"].as_i64().unwrap(),
                p["implied_wrong"].as_i64().unwrap(),
            )
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: cargo test -- --include-ignored"]
async fn each_page_shows_live_traffic_and_its_buttons_act_on_the_conversation() {
    let browser = Browser::start().await;
    let setup = Arc::new(start("127.0.0.1:0", "").await);
    let halt_k = first_k(DIALECT, Action::Halt);
    let nudge_k = first_k(DIALECT, Action::Nudge);

    // Traffic: a CI run that loops until halted, a default-policy run that is nudged, and
    // three runs of team `ask` held for a human.
    for k in 1..=halt_k {
        send(&setup, "ci", "ci-loop", k).await;
    }
    assert!(halted(&setup, "ci-loop").await);
    assert_eq!(send(&setup, "dev", "dev-run", nudge_k).await, "nudge");
    let mut held = Vec::new();
    for id in ["ask-continue", "ask-nudge", "ask-halt"] {
        let s = setup.clone();
        held.push((
            id,
            tokio::spawn(async move { send(&s, "ask", id, halt_k).await }),
        ));
    }
    setup.proxy.flush_log().await;
    let ui = setup.url("/ui/");

    // Overview: the figures and the chart of the interventions.
    browser.goto(&ui).await;
    browser.wait_for("#chart rect.bar", "").await;
    let logged = query(&setup, "SELECT count(*) FROM requests")[0][0].clone();
    browser
        .wait_until(&format!(
            "document.querySelector('#requests .value')?.innerText === '{logged}'"
        ))
        .await;
    browser.wait_for("#assumption", "estimate").await;
    browser.wait_for("#saved-steps", "1 halts").await;
    browser.wait_for("#precision-none", "No feedback").await;
    browser.screenshot("overview").await;

    // Pending approvals: the three held requests, each decided by its button.
    browser.goto(&format!("{ui}#/pending")).await;
    browser
        .wait_until("document.querySelectorAll('tr.pending').length === 3")
        .await;
    browser.wait_for("tr.pending .time-left", "s, then").await;
    browser.screenshot("pending").await;
    for (id, task) in held {
        let forwarded_before = setup.mock.requests().len();
        let (_, list) = setup.admin("/admin/api/pending", None).await;
        let ticket = list["pending"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["conversation_id"] == id)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let button = match id {
            "ask-continue" => "button.continue",
            "ask-nudge" => "button.nudge",
            _ => "button.halt",
        };
        browser
            .click_on(&format!("tr.pending[data-id='{ticket}'] {button}"), "")
            .await;
        assert_eq!(task.await.unwrap(), "pause");
        let forwarded = setup.mock.requests().len() - forwarded_before;
        match id {
            "ask-continue" => assert_eq!(forwarded, 1),
            "ask-nudge" => {
                assert_eq!(forwarded, 1);
                let sent = setup.mock.requests().last().unwrap().body.clone();
                assert_ne!(
                    sent.as_ref(),
                    loop_body(DIALECT, halt_k, false, None)
                        .to_string()
                        .as_bytes(),
                    "the nudge's reminder was added"
                );
            }
            _ => {
                assert_eq!(forwarded, 0, "halted");
                assert_eq!(send(&setup, "ask", id, halt_k + 1).await, "halt");
            }
        }
    }
    browser
        .wait_for("#no-pending", "No request is waiting")
        .await;

    // Conversations: every one (the held ones are logged once decided), newest first; then the team filter through the form.
    browser.goto(&format!("{ui}#/conversations")).await;
    browser
        .wait_until("document.querySelectorAll('tr.conversation').length === 5")
        .await;
    let ids = browser
        .eval("[...document.querySelectorAll('tr.conversation')].map(r => r.dataset.id)")
        .await;
    let newest_first: Vec<Value> = query(
        &setup,
        "SELECT id FROM conversations ORDER BY last_seen_ms DESC",
    )
    .into_iter()
    .map(|mut r| r.remove(0))
    .collect();
    assert_eq!(ids, Value::Array(newest_first));
    browser
        .wait_for("tr.conversation[data-id=ci-loop]", "ci")
        .await;
    browser.screenshot("conversations").await;
    let team = browser.wait_for("#filter-team", "").await;
    browser.type_into(&team, "ci").await;
    browser.click_on("#apply-filters", "").await;
    browser
        .wait_until(
            "document.querySelectorAll('tr.conversation').length === 1 \
             && document.querySelector('tr.conversation').dataset.id === 'ci-loop'",
        )
        .await;
    browser
        .goto(&format!("{ui}#/conversations?decision=nudge"))
        .await;
    browser
        .wait_until(
            "document.querySelectorAll('tr.conversation').length === 1 \
             && document.querySelector('tr.conversation').dataset.id === 'dev-run'",
        )
        .await;

    // One conversation's timeline; resume, feedback, halt.
    browser.goto(&format!("{ui}#/conversation/ci-loop")).await;
    browser.wait_for("#halted", "halted").await;
    browser
        .wait_for(".step .call code", "python3 test_calc.py")
        .await;
    browser
        .wait_for(".step .call .result", "AssertionError")
        .await;
    browser.wait_for(".finding", "").await;
    let halt = browser.wait_for(".intervention", "by policy").await;
    browser.screenshot("timeline").await;
    let forwarded_before = setup.mock.requests().len();
    assert_eq!(send(&setup, "ci", "ci-loop", halt_k + 1).await, "halt");
    assert_eq!(setup.mock.requests().len(), forwarded_before, "sticky");

    browser.click_on("#resume", "").await;
    browser.wait_for("#running", "").await;
    assert!(!halted(&setup, "ci-loop").await);
    assert_ne!(send(&setup, "ci", "ci-loop", halt_k + 1).await, "halt");
    assert_eq!(setup.mock.requests().len(), forwarded_before + 1);
    setup.proxy.flush_log().await;
    let all = query(&setup, "SELECT action, applied, source, detector FROM interventions WHERE conversation_id = 'ci-loop'");
    let detector = query(
        &setup,
        "SELECT detector FROM interventions WHERE conversation_id = 'ci-loop' AND action IN ('halt', 'block') AND source = 'policy'",
    ).first().unwrap_or_else(|| panic!("{all:?}"))[0]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        precision(&setup, &detector).await,
        Some((0, 1, 1)),
        "a halt a human lifted counts wrong"
    );

    // The halt was right after all: the explicit verdict replaces the implied one.
    // The timeline shows the implied verdict on the halt the resume lifted.
    let lifted = "[...document.querySelectorAll('.intervention')]\
        .find(e => (e.querySelector('.verdict')?.innerText || '').includes('resumed'))";
    browser.wait_until(&format!("{lifted} !== undefined")).await;
    let halt_id = browser
        .eval(&format!("Number({lifted}.dataset.id)"))
        .await
        .as_i64()
        .unwrap();
    let _ = halt;
    browser
        .click_on(
            &format!(".intervention[data-id='{halt_id}'] button.right"),
            "",
        )
        .await;
    browser
        .wait_for(
            &format!(".intervention[data-id='{halt_id}'] .verdict"),
            "right",
        )
        .await;
    let rows = query(
        &setup,
        "SELECT intervention_id, verdict, detector FROM feedback",
    );
    assert_eq!(
        rows,
        vec![vec![
            Value::from(halt_id),
            Value::from("right"),
            Value::from(detector.clone())
        ]]
    );
    assert_eq!(precision(&setup, &detector).await, Some((1, 0, 0)));
    // A finding judged wrong.
    browser.click_on(".finding button.wrong", "").await;
    browser.wait_for(".finding .verdict", "wrong").await;
    assert_eq!(
        query(
            &setup,
            "SELECT count(*) FROM feedback WHERE finding_id IS NOT NULL AND verdict = 'wrong'"
        )[0][0],
        1
    );

    browser.click_on("#halt", "").await;
    browser.wait_for("#halted", "halted").await;
    let before = setup.mock.requests().len();
    assert_eq!(send(&setup, "ci", "ci-loop", halt_k + 2).await, "halt");
    assert_eq!(setup.mock.requests().len(), before, "halted by hand");
    setup.proxy.flush_log().await;
    assert_eq!(
        query(&setup, "SELECT source FROM conversation_controls WHERE conversation_id = 'ci-loop' AND halted = 1")[0][0],
        "operator"
    );

    // Overview again: the precision from the feedback (the halt right, the finding wrong:
    // 50 % when the finding is the halt's detector's).
    let (right, wrong, _) = precision(&setup, &detector).await.unwrap();
    let percent = format!("{:.0} %", 100.0 * right as f64 / (right + wrong) as f64);
    browser.goto(&ui).await;
    browser
        .wait_for(
            &format!("#precision tr.precision[data-detector='{detector}']"),
            &percent,
        )
        .await;
    browser.screenshot("overview-feedback").await;

    // Policies: each with its match count.
    browser.goto(&format!("{ui}#/policies")).await;
    let ask = browser
        .wait_for("tr.policy[data-name=ask]", "\"ask\"")
        .await;
    let _ = ask;
    browser
        .wait_until(
            "Number(document.querySelector('tr.policy[data-name=ci] td.num').innerText) > 0",
        )
        .await;
    browser.wait_for("#last-reload", "").await;
    browser.screenshot("policies").await;

    // A page of another origin: its JSON fetch is stopped by the browser (the preflight
    // is refused), its form post by the proxy; the conversation stays halted.
    let evil = evil_site(&setup.url("/admin/api/conversations/ci-loop/resume")).await;
    browser.goto(&evil).await;
    browser
        .wait_until("document.title === 'fetch-failed'")
        .await;
    browser.click(&browser.wait_for("#go", "").await).await;
    browser
        .wait_until("document.body.innerText.includes('another origin')")
        .await;
    assert!(halted(&setup, "ci-loop").await, "still halted");
    setup.proxy.flush_log().await;
    assert_eq!(
        query(&setup, "SELECT count(*) FROM interventions WHERE conversation_id = 'ci-loop' AND action = 'resume'")[0][0],
        1,
        "only the dashboard's resume"
    );
}

/// A shadow policy's run that would have been halted: its answers say `observe` (nothing
/// was done), the list shows `would_halt` and not a halt, the decision filter tells the two
/// apart, and the overview's chart counts it as a series of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: cargo test -- --include-ignored"]
async fn a_shadow_run_shows_what_it_would_have_done_and_never_a_halt() {
    let browser = Browser::start().await;
    let setup = start("127.0.0.1:0", "").await;
    let halt_k = first_k(DIALECT, Action::Halt);
    for k in 1..=halt_k {
        send(&setup, "ci", "ci-loop", k).await;
        assert_eq!(send(&setup, "trial", "trial-run", k).await, "observe");
    }
    assert!(halted(&setup, "ci-loop").await);
    assert!(!halted(&setup, "trial-run").await);
    let (_, listed) = setup.admin("/admin/api/conversations", None).await;
    let last = |id: &str| {
        listed["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {listed}"))["last_decision"]
            .clone()
    };
    assert_eq!(last("ci-loop"), "halt");
    assert_eq!(last("trial-run"), "would_halt");

    let ui = setup.url("/ui/");
    let tag_of = |id: &str| {
        format!("document.querySelector(\"tr.conversation[data-id='{id}'] .tag\")?.innerText")
    };
    browser.goto(&format!("{ui}#/conversations")).await;
    browser
        .wait_until(&format!("{} === 'would_halt'", tag_of("trial-run")))
        .await;
    browser
        .wait_until(&format!("{} === 'halt'", tag_of("ci-loop")))
        .await;
    for (filter, only) in [("halt", "ci-loop"), ("would_halt", "trial-run")] {
        browser
            .goto(&format!("{ui}#/conversations?decision={filter}"))
            .await;
        browser
            .wait_until(&format!(
                "document.querySelectorAll('tr.conversation').length === 1 \
                 && document.querySelector('tr.conversation').dataset.id === '{only}'"
            ))
            .await;
    }
    // The timeline: the would-be halt, not a halt.
    browser.goto(&format!("{ui}#/conversation/trial-run")).await;
    browser.wait_for(".intervention", "would_halt").await;
    assert!(browser.find_all(".intervention .tag.halt").await.is_empty());
    assert!(browser.find_all("#halted").await.is_empty());
    // Its standing says the mode: not a bare "not halted".
    browser
        .wait_for("#shadow-standing", "shadow: would have halted")
        .await;
    assert!(browser.find_all("#running").await.is_empty());

    browser.goto(&ui).await;
    browser.wait_for("#chart rect.bar", "").await;
    let legend = browser
        .eval("[...document.querySelectorAll('.legend span')].map(s => s.innerText.trim())")
        .await;
    let legend: Vec<String> = serde_json::from_value(legend).unwrap();
    let shadow: Vec<&String> = legend
        .iter()
        .filter(|k| k.ends_with("(shadow: would have)"))
        .collect();
    assert_eq!(shadow.len(), 1, "{legend:?}");
    assert!(
        legend.len() > shadow.len(),
        "the enforced halt too: {legend:?}"
    );
    let (_, overview) = setup.admin("/admin/api/overview", None).await;
    let actions: Vec<&str> = overview["interventions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["policy"] == "trial")
        .map(|c| c["action"].as_str().unwrap())
        .collect();
    assert!(
        !actions.is_empty() && actions.iter().all(|a| a.starts_with("would_")),
        "{actions:?}"
    );
    browser.screenshot("overview-shadow").await;
}

/// An alert's link, followed in a browser that has no session yet: the login form (wearing
/// the dashboard's styles), then the halted run's timeline, not the overview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: cargo test -- --include-ignored"]
async fn an_alert_s_link_opens_the_run_s_timeline_through_the_login() {
    let browser = Browser::start().await;
    let (hook, mut alerts) = intervene_support::receiver().await;
    let token = "t0ken-for-the-alert-link";
    let setup = start_with("127.0.0.1:0", token, |c| {
        c.intervene.alerts.webhooks = vec![hook];
    })
    .await;
    // An id with characters that a URL component escapes travels percent-encoded.
    let id = "ci:run+7@x";
    let halt_k = first_k(DIALECT, Action::Halt);
    for k in 1..=halt_k {
        let r = client()
            .post(setup.url(&path("ci", id)))
            .header("content-type", "application/json")
            .body(loop_body(DIALECT, k, false, None).to_string())
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
    }
    let alert = tokio::time::timeout(std::time::Duration::from_secs(20), alerts.recv())
        .await
        .expect("the halt is alerted")
        .unwrap();
    assert_eq!(alert["conversation"], id);
    let link = alert["timeline"].as_str().unwrap().to_string();
    assert!(
        link.ends_with("/ui/#/conversation/ci%3Arun%2B7%40x"),
        "{link}"
    );

    browser.goto(&link).await;
    let field = browser.wait_for("#token", "").await;
    // The styles reach the login page: its box is laid out by app.css.
    browser
        .wait_until("getComputedStyle(document.querySelector('main.login')).maxWidth === '420px'")
        .await;
    browser.type_into(&field, token).await;
    browser.click(&browser.wait_for("#login", "").await).await;
    browser.wait_for("#halted", "halted").await;
    browser
        .wait_for(".step .call code", "python3 test_calc.py")
        .await;
    browser.wait_for(".intervention", "by policy").await;
    assert!(
        browser.body_text().await.contains(id),
        "the timeline of {id}"
    );
    // The link opens it directly once the browser has its session.
    browser.goto(&setup.url("/ui/#/policies")).await;
    browser.wait_for("tr.policy[data-name=ci]", "ci").await;
    browser.goto(&link).await;
    browser.wait_for("#halted", "halted").await;
}

/// A page on another loopback port that tries to resume a conversation through the
/// visitor's browser: a JSON `fetch` at once, and a `text/plain` form made to look like
/// JSON when `#go` is clicked.
async fn evil_site(target: &str) -> String {
    let page = format!(
        r#"<!doctype html><html><head><title>evil</title></head><body>
        <form id="f" method="post" action="{target}" enctype="text/plain">
          <input type="hidden" name='{{"a":"' value='"}}'>
          <button id="go" type="submit">go</button>
        </form>
        <script>
          fetch("{target}", {{method: "POST", headers: {{"content-type": "application/json"}}, body: "{{}}"}})
            .then(r => {{ document.title = "fetch-answered-" + r.status; }})
            .catch(() => {{ document.title = "fetch-failed"; }});
        </script></body></html>"#
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// This machine's address on its network (not loopback), if it has one.
fn network_address() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Listening on every address: a client reaching it through the network address is not
/// loopback. Without a token it gets nothing; with one, the pages send it to the login
/// form, whose cookie then opens them (in a browser:
/// [`the_browser_logs_in_once_and_lands_on_the_view_it_asked_for`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_off_this_machine_needs_the_token_and_logs_in_once() {
    let Some(ip) = network_address() else {
        eprintln!("note: no network address besides loopback; test skipped");
        return;
    };
    let no_redirect = || {
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    };
    let open = start("0.0.0.0:0", "").await;
    let base = format!("http://{ip}:{}", open.proxy.addr().port());
    for page in [
        "/ui",
        "/ui/",
        "/ui/app.js",
        "/admin/api/overview",
        "/ui/login",
    ] {
        let r = no_redirect()
            .get(format!("{base}{page}"))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        if page == "/ui/login" {
            // Nothing to log in to without a token: sent to the page, which refuses.
            assert_eq!(status, 303, "{page}");
        } else {
            assert_eq!(status, 403, "{page}: {body}");
            assert!(
                !body.contains("<html") && !body.contains("function"),
                "{page}"
            );
        }
    }

    let token = "t0ken-for-the-dashboard";
    let guarded = start("0.0.0.0:0", token).await;
    let base = format!("http://{ip}:{}", guarded.proxy.addr().port());
    let r = no_redirect()
        .get(format!("{base}/ui/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(header_of(&r, "location"), "/ui/login");
    let r = no_redirect()
        .get(format!("{base}/admin/api/overview"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let login = |body: &'static str, origin: Option<String>| {
        let mut request = no_redirect()
            .post(format!("{base}/ui/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        request.send()
    };
    let wrong = login("token=nope", None).await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
    let foreign = login(
        "token=t0ken-for-the-dashboard",
        Some("http://evil.example".into()),
    )
    .await
    .unwrap();
    assert_eq!(foreign.status().as_u16(), 403);
    assert!(foreign.headers().get("set-cookie").is_none());
    let ok = login("token=t0ken-for-the-dashboard", None).await.unwrap();
    assert_eq!(ok.status().as_u16(), 303);
    let cookie = header_of(&ok, "set-cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token),
        "the token itself is not the cookie"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let page = no_redirect()
        .get(format!("{base}/ui/"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert_eq!(header_of(&page, "x-frame-options"), "DENY");
    assert!(header_of(&page, "content-security-policy").contains("frame-ancestors 'none'"));
    // The cookie opens the API, and writes still need JSON.
    let plain = no_redirect()
        .post(format!("{base}/admin/api/feedback"))
        .header("cookie", &session)
        .header("content-type", "text/plain")
        .body(r#"{"finding_id": 1, "verdict": "wrong"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 415);
    let _ = client;
}

/// With a token, the browser gets the login form once, then the view it asked for and
/// the other pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: cargo test -- --include-ignored"]
async fn the_browser_logs_in_once_and_lands_on_the_view_it_asked_for() {
    let browser = Browser::start().await;
    let token = "t0ken-for-the-dashboard";
    let guarded = start("127.0.0.1:0", token).await;
    let base = guarded.proxy.url();
    browser.goto(&format!("{base}/ui/#/policies")).await;
    let field = browser.wait_for("#token", "").await;
    browser.screenshot("login").await;
    browser.type_into(&field, token).await;
    browser.click(&browser.wait_for("#login", "").await).await;
    // On to the view the browser asked for.
    browser.wait_for("tr.policy[data-name=ci]", "ci").await;
    browser.goto(&format!("{base}/ui/")).await;
    browser.wait_for("#requests .value", "").await;
}

/// A team's token in the browser (`[[admin.team_tokens]]`): the login page names team
/// tokens and takes one; the header names the team; the overview and the list show that
/// team's runs only; the Halt button acts on its own run; another team's timeline is not
/// there, said in words, and the next page does not carry the error; its policy page shows
/// its own policy read-only (mode, budget), with no refusal; a spent budget's alerts carry
/// no right / wrong buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium and chromedriver: cargo test -- --include-ignored"]
async fn a_team_token_logs_in_and_sees_its_team_only() {
    let browser = Browser::start().await;
    let global = "gl0bal-t0ken";
    let capped: Config = toml::from_str(
        "[[policy]]\nname = \"ci\"\nmatch = { team = \"ci\" }\n[policy.budget]\nsteps = 3\n\n\
         [[policy]]\nname = \"trial\"\nmode = \"shadow\"\nmatch = { team = \"trial\" }\n",
    )
    .unwrap();
    let setup = start_with("127.0.0.1:0", global, |c| {
        c.policies = capped.policies;
        c.admin.team_tokens = vec![TeamToken {
            team: "ci".into(),
            token_env: "LW_CI_ADMIN".into(),
            token: "ci-t0ken".into(),
        }];
    })
    .await;
    send(&setup, "ci", "ci-run", 1).await;
    send(&setup, "dev", "dev-run", 1).await;
    // Team ci's other run goes past its budget of 3 steps.
    for k in 1..=4 {
        send(&setup, "ci", "ci-capped", k).await;
    }
    setup.proxy.flush_log().await;

    browser.goto(&setup.url("/ui/#/conversations")).await;
    browser.wait_for("main.login", "your team's token").await;
    let field = browser.wait_for("#token", "").await;
    browser.type_into(&field, "ci-t0ken").await;
    browser.click(&browser.wait_for("#login", "").await).await;
    browser
        .wait_until(
            "document.querySelectorAll('tr.conversation').length === 2 \
             && [...document.querySelectorAll('tr.conversation')].every(r => r.dataset.id.startsWith('ci-'))",
        )
        .await;
    browser.wait_for("#scope", "team ci").await;
    browser.screenshot("team-conversations").await;
    browser.goto(&setup.url("/ui/#/")).await;
    browser.wait_for("h1", "Overview: team ci").await;
    browser.wait_for("#conversations .value", "2").await;
    assert!(
        browser.find_all("#live").await.is_empty(),
        "memory is every team's"
    );

    browser.goto(&setup.url("/ui/#/conversation/ci-run")).await;
    browser.click_on("#halt", "").await;
    browser.wait_for("#halted", "halted").await;
    // Halted for everyone: the global token reads it so.
    let timeline = client()
        .get(setup.url("/admin/api/conversations/ci-run"))
        .bearer_auth(global)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let timeline: Value = serde_json::from_slice(&timeline).unwrap();
    assert_eq!(timeline["halted"], true);

    // The spent budget: its alerts say what they are, with nothing to judge.
    browser
        .goto(&setup.url("/ui/#/conversation/ci-capped"))
        .await;
    browser.wait_for(".budget-cap", "budget cap").await;
    let judged = browser
        .eval(
            "[...document.querySelectorAll('.finding, .intervention')]\
             .filter(n => n.innerText.includes('budget_cap') && n.querySelector('button.right')).length",
        )
        .await;
    assert_eq!(judged, 0, "no right / wrong on a budget cap");

    // Another team's run: not there, in words; the error does not follow to the next page.
    browser.goto(&setup.url("/ui/#/conversation/dev-run")).await;
    browser
        .wait_for(
            "#status",
            "no such conversation (team ci's login sees its own runs only)",
        )
        .await;
    assert!(!browser.body_text().await.contains("not halted"));
    assert!(!browser
        .text(&browser.wait_for("#status", "").await)
        .await
        .contains("404"));
    browser.screenshot("team-not-its-run").await;

    // Its own policy, read-only, and no refusal on the way.
    browser.goto(&setup.url("/ui/#/policies")).await;
    browser.wait_for("h1", "Team ci's policy").await;
    let row = browser
        .wait_for("#team-policies tr.policy[data-name=ci]", "enforce")
        .await;
    assert!(browser.text(&row).await.contains("3 steps per run"));
    assert_eq!(browser.find_all("tr.policy").await.len(), 1, "its own only");
    browser
        .wait_until("document.getElementById('status').innerText === ''")
        .await;
    assert!(!browser.body_text().await.contains("403"));
    // An error that comes back late from the page before (its answer was on its way when
    // the view changed) is cleared by this page's next draw, not left standing on it.
    browser
        .eval("status('no such conversation (from the page before)', true)")
        .await;
    browser.wait_for("#status", "from the page before").await;
    browser
        .wait_until("document.getElementById('status').innerText === ''")
        .await;
    browser
        .wait_for("header nav a[data-view=policies]", "Policy")
        .await;
    browser.screenshot("team-policy").await;
}

/// `POST /ui/login` with `token` on `base`, no redirect followed: its `Set-Cookie` values.
async fn login_cookies(base: &str, token: &str) -> Vec<String> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    r.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// The status of `GET /admin/api/overview` on `base` with `cookie`.
async fn overview_with(base: &str, cookie: &str) -> u16 {
    client()
        .get(format!("{base}/admin/api/overview"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The dashboard's session stays the proxy's. In a browser logged in to the dashboard, the
/// requests it makes for any other path of the proxy (a path of the upstream's, the
/// favicon) carry no session: the cookie's paths are `/ui` and `/admin`. The favicon is
/// answered here, neither forwarded nor logged. A session cookie sent anyway is taken out
/// before forwarding. Each login makes a new session, which expires, and which a proxy with
/// another token refuses (one with the same token, a replica, accepts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_never_reaches_the_upstream() {
    let browser = Browser::start().await;
    let token = "t0ken-kept-at-home";
    let setup = start("127.0.0.1:0", token).await;
    send(&setup, "ci", "ci-run", 1).await;
    browser.goto(&setup.url("/ui/#/conversations")).await;
    let field = browser.wait_for("#token", "").await;
    browser.type_into(&field, token).await;
    browser.click(&browser.wait_for("#login", "").await).await;
    browser.wait_for("tr.conversation", "ci-run").await;
    browser.goto(&setup.url("/ui/#/policies")).await;
    browser.wait_for("tr.policy[data-name=ci]", "ci").await;
    // Paths that are not the proxy's own, in the same browser.
    browser.goto(&setup.url("/favicon.ico")).await;
    browser.goto(&setup.url("/v1/models")).await;
    browser
        .wait_until("document.body.innerText.length > 0")
        .await;

    let upstream = setup.mock.requests();
    assert!(
        upstream.iter().any(|r| r.path == "/v1/models"),
        "the upstream's path was forwarded"
    );
    assert!(upstream.iter().all(|r| r.path != "/favicon.ico"));
    for r in &upstream {
        let cookie = r.header("cookie").unwrap_or("");
        assert!(
            !cookie.contains("loopwarden_session"),
            "{} {cookie}",
            r.path
        );
        // Nor the operator's token, in any header.
        assert!(
            r.headers.iter().all(|(_, v)| !v.contains(token)),
            "{} {:?}",
            r.path,
            r.headers
        );
    }
    setup.proxy.flush_log().await;
    let logged = query(
        &setup,
        "SELECT path FROM requests WHERE path LIKE '%favicon%'",
    );
    assert!(logged.is_empty(), "{logged:?}");

    let base = &setup.url("");
    let cookies = login_cookies(base, token).await;
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    assert!(cookies[0].contains("; Path=/ui;"), "{cookies:?}");
    assert!(cookies[1].contains("; Path=/admin;"), "{cookies:?}");
    assert!(
        cookies.iter().all(|c| c.contains("; Max-Age=")),
        "{cookies:?}"
    );
    let session = cookies[0].split(';').next().unwrap().to_string();
    let again = login_cookies(base, token).await;
    assert_ne!(
        again[0].split(';').next().unwrap(),
        session,
        "one session per login"
    );
    assert_eq!(overview_with(base, &session).await, 200);

    // Sent anyway with a forwarded request: stripped, the client's other cookies kept.
    let r = client()
        .get(format!("{base}/v1/models"))
        .header("cookie", format!("theirs=1; {session}"))
        .send()
        .await
        .unwrap();
    r.bytes().await.unwrap();
    let last = setup.mock.requests().pop().unwrap();
    assert_eq!(last.path, "/v1/models");
    assert_eq!(last.header("cookie"), Some("theirs=1"));

    // Another token: the session is not one of its own. The same token: it is.
    let other = start("127.0.0.1:0", "a-new-t0ken").await;
    assert_eq!(overview_with(&other.url(""), &session).await, 401);
    let replica = start("127.0.0.1:0", token).await;
    assert_eq!(overview_with(&replica.url(""), &session).await, 200);
}

fn header_of(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}
