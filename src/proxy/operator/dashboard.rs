//! The dashboard: the page at `/ui` (its files in `ui/`, built into the binary), its login
//! for a browser when `admin.token` is set, and the admin API calls only it needs
//! (`/admin/api/overview`, `/admin/api/feedback`). Every page is drawn by `ui/app.js` from
//! the admin API's JSON; the page's own writes go through the admin API's checks (JSON
//! body, no foreign `Origin`: [`super::admin::check`]).
//!
//! Access: the same rules as the admin API. A browser cannot send a bearer token on a
//! page load, so with a token set, `POST /ui/login` takes it once from a form and sets a
//! session cookie that [`super::admin::check`] accepts in its place: random per login,
//! expiring, sent to `/ui` and `/admin` only ([`super::session`]).

use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form, Json};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

use super::admin::{self, Access, Denied};
use super::session;
use crate::proxy::forward::App;
use crate::store::dashboard::{HaltedRun, Target, Verdict};
use crate::store::now_ms;

const INDEX_HTML: &str = include_str!("../../../ui/index.html");
const LOGIN_HTML: &str = include_str!("../../../ui/login.html");
const APP_JS: &str = include_str!("../../../ui/app.js");
const APP_CSS: &str = include_str!("../../../ui/app.css");
const LOGIN_JS: &str = include_str!("../../../ui/login.js");

/// Scripts and styles from this origin only (no inline script: a text that reached the
/// page from the log cannot run), connections to this origin only, never in a frame.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The headers every `/ui` answer carries: no framing (clickjacking), no sniffing, no
/// caching of pages that show the log, no referrer to other sites. (`no-referrer` would
/// make the browser send `Origin: null` on the page's own writes, which are refused.)
pub async fn page_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The admin API's access rules for the pages; a browser without the token is sent to
/// the login form rather than shown a JSON error.
pub async fn require_page_access(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let listen = app.config.listen_addr().ok().map(|a| a.ip());
    let admin = &app.config.admin;
    match admin::access(admin, listen, peer, request.method(), request.headers()) {
        Ok(_) => next.run(request).await,
        Err(Denied::WrongToken) => see_other("/ui/login"),
        // Off this machine with only team tokens set: a team's member logs in with one.
        Err(Denied::NotLoopback) if !admin.team_tokens.is_empty() => see_other("/ui/login"),
        Err(denied) => admin::refusal(denied),
    }
}

fn see_other(to: &str) -> Response {
    match HeaderValue::from_str(to) {
        Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
        Err(_) => (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui/")]).into_response(),
    }
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// `GET /ui`, `/ui/`: the page (its script draws whichever view the URL's `#` names).
pub async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn app_js() -> Response {
    file("text/javascript; charset=utf-8", APP_JS)
}

/// The styles, served outside the login (the login page wears them too); they hold
/// nothing of the log.
pub async fn app_css() -> Response {
    file("text/css; charset=utf-8", APP_CSS)
}

/// The login page's script (`ui/login.js`), outside the login like the page.
pub async fn login_js() -> Response {
    file("text/javascript; charset=utf-8", LOGIN_JS)
}

/// `GET /ui/login`: the token form (without a token set there is nothing to log in to).
pub async fn login_form(State(app): State<Arc<App>>) -> Response {
    let admin = &app.config.admin;
    if admin.token.is_empty() && admin.team_tokens.is_empty() {
        return see_other("/ui/");
    }
    login_page(StatusCode::OK, "")
}

fn login_page(status: StatusCode, message: &str) -> Response {
    let html = LOGIN_HTML.replace("{{message}}", message);
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
    /// The dashboard view the browser was on its way to (`#/conversation/ID`), set by
    /// `ui/login.js` from the page's `#`.
    #[serde(default)]
    view: String,
}

/// Where a login sends the browser: `/ui/` and the view it asked for, when `view` is one
/// (`#/` then URL characters only; anything else is dropped, never echoed into a header).
fn after_login(view: &str) -> String {
    let url_char = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/?%".contains(c);
    match view.strip_prefix("#/") {
        Some(rest) if rest.chars().all(url_char) => format!("/ui/{view}"),
        _ => "/ui/".to_string(),
    }
}

/// `POST /ui/login` (a form with `token`): the right token gets the session cookie. A
/// form posted from another origin is refused, so no page can log a browser in to its
/// own choice of session.
pub async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let admin = &app.config.admin;
    if admin.token.is_empty() && admin.team_tokens.is_empty() {
        return see_other("/ui/");
    }
    if admin::foreign_origin(&headers) {
        return admin::refusal(Denied::ForeignOrigin);
    }
    // The global token or a team's: the session is signed with the one given, and
    // `admin::access` knows from it which one it stands for.
    let given = form.token.trim().as_bytes();
    let global = (!admin.token.is_empty()).then_some(admin.token.as_str());
    let teams = admin.team_tokens.iter().map(|t| t.token.as_str());
    let Some(token) = global
        .into_iter()
        .chain(teams)
        .find(|token| admin::constant_time_eq(given, token.as_bytes()))
    else {
        return login_page(StatusCode::UNAUTHORIZED, "That is not an admin token.");
    };
    let Some(session) = session::new_value(token, session::now_secs()) else {
        return login_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "No session can be made now (the system's random source failed).",
        );
    };
    let mut response = see_other(&after_login(&form.view));
    for cookie in session::set_cookies(&session, reached_over_https(&app)) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// Whether browsers reach the proxy over HTTPS (TLS on the listener, or a `public_url`
/// in front of it that says so): its session cookie is then `Secure`.
fn reached_over_https(app: &App) -> bool {
    let server = &app.config.server;
    !server.tls_cert.is_empty() || server.public_url.starts_with("https://")
}

#[derive(Deserialize)]
pub struct OverviewParams {
    hours: Option<i64>,
}

/// How long a halted run is assumed to have gone on without the halt, at most: until
/// someone noticed, which without loopwarden is when a person looks, if the run has no cap.
pub const ASSUMED_MINUTES: f64 = 30.0;

/// What the overview says the estimate assumes. Fixed at the halt: it never grows while
/// the overview is open (an estimate that rose with the clock, to more than the runs had
/// spent, was no figure a team could defend), and no run is assumed to save more than it
/// had spent before its halt.
const ASSUMPTION: &str = "An estimate. Each halted run is assumed to have gone on, without the \
    halt, as long again as it had run (30 minutes at most), at its pace before the halt (its \
    steps and dollars per minute since its first request, over at least a minute); a run \
    resumed sooner counts until it was resumed. So no run counts more than it spent before \
    its halt, and the figure does not grow with time.";

/// The overview's estimate of what the halts saved.
#[derive(Debug, Serialize, PartialEq)]
pub struct Savings {
    pub estimate: bool,
    pub assumption: &'static str,
    pub halts: usize,
    pub steps: f64,
    pub dollars: f64,
}

/// Steps and dollars the halted runs would have spent had they gone on (see [`ASSUMPTION`]).
pub fn estimate_savings(runs: &[HaltedRun]) -> Savings {
    let mut savings = Savings {
        estimate: true,
        assumption: ASSUMPTION,
        halts: runs.len(),
        steps: 0.0,
        dollars: 0.0,
    };
    for run in runs {
        let ran = (run.halted_ms - run.first_ms) as f64 / 60_000.0;
        let ran_minutes = ran.max(1.0);
        let mut spared_minutes = ran.clamp(0.0, ASSUMED_MINUTES);
        if let Some(resumed) = run.resumed_ms {
            spared_minutes =
                spared_minutes.min(((resumed - run.halted_ms) as f64 / 60_000.0).max(0.0));
        }
        savings.steps += run.steps as f64 / ran_minutes * spared_minutes;
        savings.dollars += run.cost_usd / ran_minutes * spared_minutes;
    }
    savings
}

/// `GET /admin/api/overview?hours=24`: the overview's figures over the last `hours`
/// (1 to 720): requests and conversations, what is live, the policies' interventions per
/// bucket (a 24th of the window) by detector and policy, the halts' savings (an
/// estimate), and each detector's precision from the feedback.
pub async fn overview(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Query(params): Query<OverviewParams>,
) -> Response {
    let hours = params.hours.unwrap_or(24).clamp(1, 720);
    let now = now_ms();
    let since_ms = now - hours * 3_600_000;
    let bucket_ms = hours * 3_600_000 / 24;
    let store = &app.store;
    let team = access.team();
    let (totals, counts, runs, precision) = match tokio::try_join!(
        store.totals(since_ms, team),
        store.intervention_counts(since_ms, bucket_ms, team),
        store.halted_runs(since_ms, team),
        store.precision(team),
    ) {
        Ok(all) => all,
        Err(e) => return admin::internal(e),
    };
    let (halted, pending) = match admin::live_counts(&app, &access).await {
        Ok(counts) => counts,
        Err(e) => return admin::internal(e),
    };
    Json(serde_json::json!({
        "window": { "hours": hours, "since_ms": since_ms, "bucket_ms": bucket_ms, "now_ms": now },
        "team": team,
        "totals": totals,
        // What memory holds is every team's: a team's view leaves it out.
        "live_conversations": team.is_none().then(|| app.analyser.memory.held().conversations),
        "halted_conversations": halted,
        "pending": pending,
        "interventions": counts,
        "savings": estimate_savings(&runs),
        "precision": precision,
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedbackBody {
    finding_id: Option<i64>,
    intervention_id: Option<i64>,
    verdict: Verdict,
    #[serde(default)]
    note: Option<String>,
}

/// Longest note kept, in characters.
const NOTE_CHARS: usize = 1000;

/// `POST /admin/api/feedback` with `{"finding_id" | "intervention_id": N, "verdict":
/// "right" | "wrong", "note": "..."}`: a human's word on an alert; the latest one on an
/// alert counts. 404 for an alert the log does not hold.
pub async fn feedback(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    body: axum::body::Bytes,
) -> Response {
    const SHAPE: &str = "expected {\"finding_id\" | \"intervention_id\": N, \"verdict\": \"right\" | \"wrong\", \"note\": \"...\"}";
    let parsed: FeedbackBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return admin::bad_request(&format!("{SHAPE}: {e}")),
    };
    let target = match (parsed.finding_id, parsed.intervention_id) {
        (Some(id), None) => Target::Finding(id),
        (None, Some(id)) => Target::Intervention(id),
        _ => return admin::bad_request(&format!("{SHAPE}: exactly one id")),
    };
    let note: String = parsed
        .note
        .unwrap_or_default()
        .chars()
        .take(NOTE_CHARS)
        .collect();
    let note = crate::store::Masked::from(note);
    if access.team().is_some() {
        // An alert of another team's conversation is answered as one the log does not hold.
        let reached = match app.store.alert_conversation(target).await {
            Ok(Some(conversation)) => admin::reaches(&app, &access, &conversation).await,
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        match reached {
            Ok(true) => {}
            Ok(false) => return no_such_alert(),
            Err(e) => return admin::internal(e),
        }
    }
    match app
        .store
        .give_feedback(target, parsed.verdict, note.as_str())
        .await
    {
        Ok(Some(recorded)) => Json(serde_json::json!({ "feedback": recorded })).into_response(),
        Ok(None) => no_such_alert(),
        Err(e) => admin::internal(e),
    }
}

fn no_such_alert() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no such finding or intervention" })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_goes_on_to_the_view_it_came_for_and_nowhere_else() {
        assert_eq!(
            after_login("#/conversation/my%20run"),
            "/ui/#/conversation/my%20run"
        );
        assert_eq!(after_login(""), "/ui/");
        for odd in [
            "#/a b",
            "#/x\r\nset-cookie: a=b",
            "//evil.example",
            "#x",
            "https://e",
        ] {
            assert_eq!(after_login(odd), "/ui/", "{odd:?}");
        }
    }

    fn run(
        first_ms: i64,
        halted_ms: i64,
        steps: i64,
        cost_usd: f64,
        resumed_ms: Option<i64>,
    ) -> HaltedRun {
        HaltedRun {
            conversation_id: "c".into(),
            detector: "fail_loop".into(),
            halted_ms,
            first_ms,
            steps,
            cost_usd,
            resumed_ms,
        }
    }

    #[test]
    fn savings_go_on_as_long_again_as_the_run_at_its_pace_and_never_grow() {
        let min = 60_000;
        // 10 steps and $2 over 10 minutes, resumed 5 minutes after the halt: 5 steps, $1.
        let resumed = run(0, 10 * min, 10, 2.0, Some(15 * min));
        // 4 steps and $1 over 2 minutes, still halted: as long again, 4 steps and $1.
        let halted = run(0, 2 * min, 4, 1.0, None);
        // 120 steps and $60 over 2 hours: 30 minutes at its pace, 30 steps and $15.
        let long = run(0, 120 * min, 120, 60.0, None);
        // A run of seconds: its pace over a minute, for its own seconds: 3 × 1/60 steps.
        let short = run(0, 1000, 3, 0.0, None);
        let s = estimate_savings(&[resumed, halted, long, short]);
        assert_eq!(s.halts, 4);
        assert!(
            (s.steps - (5.0 + 4.0 + 30.0 + 0.05)).abs() < 1e-6,
            "{}",
            s.steps
        );
        assert!(
            (s.dollars - (1.0 + 1.0 + 15.0)).abs() < 1e-6,
            "{}",
            s.dollars
        );
        assert!(s.estimate);
        // No run counts more than it spent before its halt.
        assert!(s.dollars <= 2.0 + 1.0 + 60.0);
    }
}
