//! The admin API under `/admin/api/` (routed in [`super::own`]).
//!
//! Access ([`check`]): with `admin.token` set, every call needs `Authorization: Bearer
//! <token>`; without one, only loopback clients that name this machine in `Host` are
//! answered (the log holds what agents did). Either way a write needs a JSON body type and
//! no foreign `Origin`, so that no web page can make a browser call it: a page's cross-origin
//! `text/plain` or form POST needs no preflight, and a page whose host name was rebound to
//! 127.0.0.1 (DNS rebinding) reaches loopback with its own name in `Host`.
//!
//! Who the caller is ([`Access`]): the global token (or a loopback client when none is
//! set) reaches everything; a team's token (`[[admin.team_tokens]]`) reaches that team's
//! conversations only. For a team, a conversation of another team is answered as one that
//! does not exist (404, so that ids do not leak), the figures are its own, and what is the
//! whole proxy's (a reload, the process's health) is refused (403); of the policies it
//! reads its team's own.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::{header, HeaderMap, Method, StatusCode};
use serde::Deserialize;

use crate::proxy::forward::App;

/// Why the admin API refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No token is configured and the client is not on this machine.
    NotLoopback,
    /// A token is configured and the call does not carry it.
    WrongToken,
    /// No token is configured and `Host` names something other than this machine.
    ForeignHost,
    /// A write sent by a web page of another origin.
    ForeignOrigin,
    /// A write whose body is not declared JSON.
    NotJson,
    /// A team's token, on a call about the whole proxy.
    TeamScope,
}

/// Whom the admin API answers (put in each admin request's extensions by
/// [`require_access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The global token, or a loopback client when none is set: everything.
    Global,
    /// A team's token: that team's conversations (the team as the log has it).
    Team(Arc<str>),
}

impl Access {
    /// The team the caller is limited to, if any.
    pub fn team(&self) -> Option<&str> {
        match self {
            Access::Global => None,
            Access::Team(team) => Some(team),
        }
    }
}

impl Denied {
    pub fn status(self) -> StatusCode {
        match self {
            Denied::WrongToken => StatusCode::UNAUTHORIZED,
            Denied::NotLoopback
            | Denied::ForeignHost
            | Denied::ForeignOrigin
            | Denied::TeamScope => StatusCode::FORBIDDEN,
            Denied::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Denied::NotLoopback => {
                "admin API: loopback clients only (set LOOPWARDEN_ADMIN_TOKEN to allow others)"
            }
            Denied::WrongToken => "admin API: missing or wrong bearer token",
            Denied::ForeignHost => {
                "admin API: without a token, the Host header must name this machine \
                 (localhost, 127.0.0.1, [::1] or the listen address)"
            }
            Denied::ForeignOrigin => {
                "admin API: writes from a web page of another origin are refused"
            }
            Denied::NotJson => "admin API: writes need Content-Type: application/json",
            Denied::TeamScope => {
                "admin API: a team's token reads and acts on its team's conversations only; \
                 this call is about the whole proxy"
            }
        }
    }
}

/// The access rules, in order: who may call (the token, or a loopback client naming this
/// machine), then, for a write, where from (`Origin`) and what (`Content-Type`). `listen` is
/// the configured listen address, a name of this machine too when it is not a wildcard.
pub fn check(
    token: &str,
    listen: Option<IpAddr>,
    peer: SocketAddr,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), Denied> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if token.is_empty() {
        if !is_loopback(peer.ip()) {
            return Err(Denied::NotLoopback);
        }
        if !host.is_some_and(|h| names_this_machine(h, listen)) {
            return Err(Denied::ForeignHost);
        }
    } else {
        let presented = bearer(headers);
        let by_header = constant_time_eq(presented.as_bytes(), token.as_bytes());
        if !by_header && !has_session_cookie(headers, token) {
            return Err(Denied::WrongToken);
        }
    }
    write_rules(method, headers)
}

/// What a write must be, whoever sends it: a JSON body from no other origin.
fn write_rules(method: &Method, headers: &HeaderMap) -> Result<(), Denied> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    if foreign_origin(headers) {
        return Err(Denied::ForeignOrigin);
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Denied::NotJson);
    }
    Ok(())
}

/// Who is calling, by [`check`]'s rules, or a team's token (`admin.team_tokens`) in the
/// `Authorization` header or as the dashboard's session cookie, which reaches its team's
/// conversations from anywhere (and never more, even from loopback).
pub fn access(
    admin: &crate::config::AdminConfig,
    listen: Option<IpAddr>,
    peer: SocketAddr,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Access, Denied> {
    let presented = bearer(headers);
    let team = admin.team_tokens.iter().find(|t| {
        constant_time_eq(presented.as_bytes(), t.token.as_bytes())
            || has_session_cookie(headers, &t.token)
    });
    if let Some(team) = team {
        write_rules(method, headers)?;
        return Ok(Access::Team(team.team.as_str().into()));
    }
    check(&admin.token, listen, peer, method, headers).map(|()| Access::Global)
}

/// The `Authorization: Bearer` token, or "".
fn bearer(headers: &HeaderMap) -> &str {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}

/// Whether the request states an `Origin` other than the `Host` it is sent to (a web
/// page of another site, or `null`).
pub fn foreign_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let own = origin
        .to_str()
        .ok()
        .and_then(|o| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
        })
        .zip(host)
        .is_some_and(|(origin, host)| origin.eq_ignore_ascii_case(host));
    !own
}

/// Whether the request carries a dashboard session of `token` that is still valid
/// ([`super::session`]).
fn has_session_cookie(headers: &HeaderMap, token: &str) -> bool {
    super::session::presented(headers, token, super::session::now_secs())
}

/// Loopback, an IPv4 client of a listener on `[::]` (`::ffff:127.0.0.1`) included.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Whether a `Host` value (port or not) names this machine: `localhost`, a loopback address
/// (`127.x.y.z`, `[::1]`), or the listen address unless it is a wildcard (browsers take
/// `0.0.0.0` to mean this machine, so a page may name it).
fn names_this_machine(host: &str, listen: Option<IpAddr>) -> bool {
    let Ok(authority) = host.parse::<http::uri::Authority>() else {
        return false;
    };
    let name = authority.host();
    if authority.as_str().contains('@') {
        return false;
    }
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let ip = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6),
        None => name.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4),
    };
    ip.is_some_and(|ip| is_loopback(ip) || (Some(ip) == listen && !ip.is_unspecified()))
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The access rules ([`access`]), applied once to every `/admin/` route; the handlers find
/// who called in the request's [`Access`].
pub async fn require_access(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let listen = app.config.listen_addr().ok().map(|a| a.ip());
    match access(
        &app.config.admin,
        listen,
        peer,
        request.method(),
        request.headers(),
    ) {
        Ok(access) => {
            request.extensions_mut().insert(access);
            next.run(request).await
        }
        Err(denied) => refusal(denied),
    }
}

/// For the calls about the whole proxy (its policies, a reload): a team's token is refused.
/// Runs after [`require_access`].
pub async fn require_global(request: Request, next: Next) -> Response {
    match request.extensions().get::<Access>() {
        Some(Access::Global) => next.run(request).await,
        _ => refusal(Denied::TeamScope),
    }
}

/// `Ok` when `access` reaches conversation `id`, else the answer: no such conversation.
async fn within_reach(app: &App, access: &Access, id: &str) -> Result<(), Response> {
    match reaches(app, access, id).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(no_such_conversation()),
        Err(e) => Err(internal(e)),
    }
}

/// Whether `access` reaches conversation `id`: the global access every one, a team's only
/// those the log holds under its team.
pub async fn reaches(app: &App, access: &Access, id: &str) -> Result<bool, crate::store::Error> {
    match access.team() {
        None => Ok(true),
        Some(team) => {
            let logged = app.store.conversation_team(id).await?;
            Ok(logged.flatten().as_deref() == Some(team))
        }
    }
}

/// The answer to a call the access rules refused.
pub fn refusal(denied: Denied) -> Response {
    let body = Json(serde_json::json!({ "error": denied.message() }));
    (denied.status(), body).into_response()
}

pub fn internal(e: crate::store::Error) -> Response {
    tracing::warn!(error = %e, "admin query failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(serde_json::json!({ "error": "log query failed" })),
    )
        .into_response()
}

#[derive(Deserialize)]
pub struct ListParams {
    limit: Option<i64>,
}

/// `GET /admin/api/conversations?limit=N`: newest first, with counts, the latest
/// request's policy and the team; filtered by `policy`, `team`, `client`, `model` and
/// `decision` (the latest request's) when given.
pub async fn conversations(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Query(params): Query<ListParams>,
    Query(filter): Query<crate::store::dashboard::ConversationFilter>,
) -> Response {
    let limit = params.limit.unwrap_or(100).clamp(1, 10_000);
    let mut filter = filter.normalized();
    if let Some(team) = access.team() {
        // A team's token lists its team's conversations, whatever team the query names.
        filter.team = Some(team.to_string());
    }
    match app.store.listed_conversations(&filter, limit).await {
        Ok(list) => Json(serde_json::json!({ "conversations": list })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/conversations/{id}`: the timeline, and the conversation's `spend` (null
/// when nothing was charged to it lately).
pub async fn conversation(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
) -> Response {
    if let Err(refused) = within_reach(&app, &access, &id).await {
        return refused;
    }
    #[derive(serde::Serialize)]
    struct WithSpend {
        #[serde(flatten)]
        timeline: crate::store::Timeline,
        spend: Option<crate::budget::Spend>,
        alerts: crate::store::dashboard::Alerts,
        halted: bool,
    }
    let read = tokio::try_join!(app.store.timeline(&id), app.store.alerts(&id));
    match read {
        Ok((Some(timeline), alerts)) => Json(WithSpend {
            timeline,
            spend: app.ledger.spend(&id),
            alerts,
            halted: app
                .interventions
                .controls
                .get(&id)
                .is_some_and(|c| c.halted),
        })
        .into_response(),
        Ok((None, _)) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/spend?limit=N`: totals per policy, and the conversations (the most
/// recently charged first, at most N, 100 by default) with their spend. Covers what the
/// ledger holds: the conversations charged in the last day (`crate::budget::Ledger`).
pub async fn spend(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Query(params): Query<ListParams>,
) -> Response {
    #[derive(serde::Serialize)]
    struct Conversation {
        id: String,
        #[serde(flatten)]
        spend: crate::budget::Spend,
    }
    let limit = params.limit.unwrap_or(100).clamp(1, 10_000) as usize;
    let Some(team) = access.team() else {
        let conversations: Vec<Conversation> = app
            .ledger
            .conversations(limit)
            .into_iter()
            .map(|(id, spend)| Conversation { id, spend })
            .collect();
        return Json(serde_json::json!({
            "policies": app.ledger.policies(),
            "conversations": conversations,
        }))
        .into_response();
    };
    // A team's: its conversations among those the ledger holds (charged in the last day),
    // and no policy totals, which are every team's.
    let since_ms = crate::store::now_ms() - 2 * 24 * 3_600_000;
    let ours: std::collections::HashSet<String> =
        match app.store.team_conversations(team, since_ms).await {
            Ok(ids) => ids.into_iter().collect(),
            Err(e) => return internal(e),
        };
    let conversations: Vec<Conversation> = app
        .ledger
        .conversations(usize::MAX)
        .into_iter()
        .filter(|(id, _)| ours.contains(id))
        .take(limit)
        .map(|(id, spend)| Conversation { id, spend })
        .collect();
    Json(serde_json::json!({
        "team": team,
        "policies": [],
        "conversations": conversations,
    }))
    .into_response()
}

fn no_such_conversation() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no such conversation" })),
    )
        .into_response()
}

/// `POST /admin/api/conversations/{id}/resume`: releases a halted conversation; its next
/// request goes upstream and detection starts over from there. 404 for an id the proxy
/// has not seen.
pub async fn resume_conversation(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
) -> Response {
    if let Err(refused) = within_reach(&app, &access, &id).await {
        return refused;
    }
    match app.interventions.operator_resume(&id).await {
        Ok(Some(control)) => Json(serde_json::json!({ "resumed": control })).into_response(),
        Ok(None) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize, Default)]
struct HaltBody {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /admin/api/conversations/{id}/halt` (optional body `{"reason": "..."}`): halts a
/// conversation by hand; its requests get the halt reply until it is resumed or a human
/// writes to it. 404 for an id the proxy has not seen.
pub async fn halt_conversation(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = within_reach(&app, &access, &id).await {
        return refused;
    }
    let parsed: HaltBody = if body.iter().all(u8::is_ascii_whitespace) {
        HaltBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => return bad_request(&format!("expected {{\"reason\": \"...\"}}: {e}")),
        }
    };
    let reason = parsed
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "no reason given".to_string());
    match app.interventions.operator_halt(&id, &reason).await {
        Ok(Some(control)) => Json(serde_json::json!({ "halted": control })).into_response(),
        Ok(None) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/pending`: requests held for a human, oldest first.
/// With replicas sharing a database, every replica's.
pub async fn pending(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
) -> Response {
    let listing = app.interventions.pending.list_everywhere().await;
    let pending = match reachable(&app, &access, listing.pending).await {
        Ok(pending) => pending,
        Err(e) => return internal(e),
    };
    Json(serde_json::json!({
        "pending": pending,
        "complete": listing.incomplete.is_none(),
        "incomplete": listing.incomplete,
    }))
    .into_response()
}

/// The held requests (as listed) of the conversations `access` reaches.
async fn reachable(
    app: &App,
    access: &Access,
    held: Vec<serde_json::Value>,
) -> Result<Vec<serde_json::Value>, crate::store::Error> {
    if access.team().is_none() {
        return Ok(held);
    }
    let mut ours = Vec::with_capacity(held.len());
    for request in held {
        let team = request["team"].as_str();
        let conversation = request["conversation_id"].as_str().unwrap_or_default();
        if held_reaches(app, access, team, conversation).await? {
            ours.push(request);
        }
    }
    Ok(ours)
}

/// Whether `access` reaches a request held for `conversation` that named `team`: by the
/// team it named (its conversation may have nothing in the log yet), else by the log's.
pub async fn held_reaches(
    app: &App,
    access: &Access,
    team: Option<&str>,
    conversation: &str,
) -> Result<bool, crate::store::Error> {
    if team.is_some() && team == access.team() {
        return Ok(true);
    }
    reaches(app, access, conversation).await
}

#[derive(Deserialize)]
struct DecideBody {
    decision: crate::intervene::Verdict,
}

/// `POST /admin/api/pending/{id}` with `{"decision": "continue" | "nudge" | "halt"}`.
pub async fn decide_pending(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let verdict = match serde_json::from_slice::<DecideBody>(&body) {
        Ok(b) => b.decision,
        Err(e) => {
            return bad_request(&format!(
                "expected {{\"decision\": \"continue\" | \"nudge\" | \"halt\"}}: {e}"
            ))
        }
    };
    if access.team().is_some() {
        // Only a request held for one of the team's conversations; another's is answered
        // as one that is not held.
        let listing = app.interventions.pending.list_everywhere().await;
        let held = listing.pending.into_iter().find(|h| h["id"] == id.as_str());
        let conversation = held.as_ref().and_then(|h| h["conversation_id"].as_str());
        let team = held.as_ref().and_then(|h| h["team"].as_str());
        match conversation {
            Some(conversation) => match held_reaches(&app, &access, team, conversation).await {
                Ok(true) => {}
                Ok(false) => return not_held(),
                Err(e) => return internal(e),
            },
            None => return not_held(),
        }
    }
    match app
        .interventions
        .pending
        .decide_anywhere(&id, verdict)
        .await
    {
        Err(e) => internal(e),
        Ok(Some(held)) => Json(serde_json::json!({ "decided": verdict.as_str(), "pending": held }))
            .into_response(),
        Ok(None) => match app.interventions.pending.abandoned(&id) {
            Some(held) => (
                StatusCode::GONE,
                Json(serde_json::json!({
                    "error": "abandoned: the request's client went away before anyone decided",
                    "pending": held,
                })),
            )
                .into_response(),
            None => not_held(),
        },
    }
}

fn not_held() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no request held under that id (decided, timed out or gone)" })),
    )
        .into_response()
}

pub fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

/// `GET /admin/api/access`: whom the caller's credentials stand for, `{"team": "ci"}` for a
/// team's token and `{"team": null}` for the global one (or a loopback client without
/// one): the dashboard names the team and draws its views.
pub async fn access_of(Extension(access): Extension<Access>) -> Response {
    Json(serde_json::json!({ "team": access.team() })).into_response()
}

/// `GET /admin/api/policies`: the policies in force in the order they are tried (the
/// default last), how many requests each matched, and what the last reload came to. A
/// team's token reads its own, read-only: the policies whose `match.team` names its team
/// (mode, budgets, what they match; the default when none does, its requests' policy),
/// with `team` set; not the file, the reloads nor the other teams' policies.
pub async fn policies(
    State(app): State<Arc<App>>,
    Extension(access): Extension<Access>,
) -> Response {
    let set = app.policies.current();
    let describe = |p: &crate::policy::Policy| {
        serde_json::json!({
            "name": &*p.name,
            "mode": p.mode.as_str(),
            "match": &p.selector,
            "matched": p.matched(),
            "budget": &p.budget,
            "log": &p.log,
        })
    };
    if let Some(team) = access.team() {
        let mut own: Vec<serde_json::Value> = set
            .iter()
            .filter(|p| p.selector.names_team(team))
            .map(|p| describe(p))
            .collect();
        let named = !own.is_empty();
        if !named {
            own.extend(set.named(crate::names::DEFAULT_POLICY).map(|p| describe(p)));
        }
        return Json(serde_json::json!({
            "team": team,
            "policies": own,
            // False: no policy names the team, its requests fall under the default.
            "named": named,
        }))
        .into_response();
    }
    let policies: Vec<serde_json::Value> = set.iter().map(|p| describe(p)).collect();
    Json(serde_json::json!({
        "policies": policies,
        "config": app.config.source.as_ref().map(|p| p.display().to_string()),
        "last_reload": app.policies.last(),
    }))
    .into_response()
}

/// `POST /admin/api/policies/reload`: what SIGHUP does, with its result as the answer
/// (422 when the file was rejected: the policies in force stay).
pub async fn reload_policies(State(app): State<Arc<App>>) -> Response {
    let reload = app.policies.reload("admin");
    let status = match reload.outcome {
        crate::reload::Outcome::Applied => StatusCode::OK,
        crate::reload::Outcome::Rejected => StatusCode::UNPROCESSABLE_ENTITY,
    };
    (status, Json(reload)).into_response()
}

/// `GET /admin/api/stats`: the proxy's own overhead and the log's health. The overhead is
/// read from the log; the health is counted in memory, and answered even when the log
/// cannot be read (a database down is when it matters most): `proxy_overhead_us` is then
/// null and `log_read_error` says why.
pub async fn stats(State(app): State<Arc<App>>, Extension(access): Extension<Access>) -> Response {
    if let Some(team) = access.team() {
        return team_stats(&app, &access, team).await;
    }
    let (overhead, log_read_error) = match app.store.overhead(1000).await {
        Ok(overhead) => (Some(overhead), None),
        Err(e) => (None, Some(e.to_string())),
    };
    // Each detector's right / (right + wrong) from the feedback on its alerts
    // (`POST /admin/api/feedback`; a halt a human lifted counts wrong).
    let precision = match app.store.precision(None).await {
        Ok(precision) => Some(precision),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the feedback for the stats");
            None
        }
    };
    let held = app.analyser.memory.held();
    Json(serde_json::json!({
        "proxy_overhead_us": overhead,
        "log": app.store.health(),
        "log_read_error": log_read_error,
        // OpenTelemetry spans sent, dropped (queue full) and failed (collector).
        "traces": app.traces.counts(),
        "cache": { "messages": held.messages, "bytes": held.message_bytes },
        // Conversations whose state (last request, transcript, engine fold) is held
        // in memory, and the bytes charged for it (`cache.conversation_max_bytes`);
        // idle ones are dropped, so this falls back to 0 when agents stop.
        "live_conversations": held.conversations,
        "conversation_bytes": held.conversation_bytes,
        // Open client connections on each serving thread (see `proxy::serve::spread`).
        "connections": app.spread.open(),
        // Connections closed at `server.max_connections` to make room, and refused.
        "connections_at_cap": app.connections.at_cap(),
        "precision": precision,
    }))
    .into_response()
}

/// `GET /admin/api/stats` for a team's token: the detectors' precision on its team's
/// alerts, its halted conversations and held requests. The process's own figures (overhead,
/// log health, cache, connections) are every team's, and the global token's to read.
async fn team_stats(app: &App, access: &Access, team: &str) -> Response {
    let precision = match app.store.precision(Some(team)).await {
        Ok(precision) => precision,
        Err(e) => return internal(e),
    };
    let (halted, held) = match live_counts(app, access).await {
        Ok(counts) => counts,
        Err(e) => return internal(e),
    };
    Json(serde_json::json!({
        "team": team,
        "precision": precision,
        "halted_conversations": halted,
        "pending": held,
    }))
    .into_response()
}

/// The halted conversations and the requests held on this replica that `access` reaches.
pub async fn live_counts(
    app: &App,
    access: &Access,
) -> Result<(usize, usize), crate::store::Error> {
    if access.team().is_none() {
        return Ok((
            app.interventions.controls.halted().len(),
            app.interventions.pending.list().len(),
        ));
    }
    let mut halted = 0;
    for control in app.interventions.controls.halted() {
        halted += usize::from(reaches(app, access, &control.conversation_id).await?);
    }
    let mut pending = 0;
    for held in app.interventions.pending.list() {
        let team = held.team.as_deref();
        pending += usize::from(held_reaches(app, access, team, &held.conversation_id).await?);
    }
    Ok((halted, pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn access_rules() {
        let loopback: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5".parse().unwrap();
        let get = |token, peer, h: &HeaderMap| check(token, None, peer, &Method::GET, h);
        let local = headers(&[("host", "127.0.0.1:8788")]);
        assert_eq!(get("", loopback, &local), Ok(()));
        assert_eq!(get("", mapped, &local), Ok(()));
        assert_eq!(get("", remote, &local), Err(Denied::NotLoopback));
        let good = headers(&[("host", "x"), ("authorization", "Bearer s3cret")]);
        let bad = headers(&[("host", "x"), ("authorization", "Bearer s3cres")]);
        assert_eq!(get("s3cret", remote, &good), Ok(()));
        assert_eq!(get("s3cret", loopback, &bad), Err(Denied::WrongToken));
        assert_eq!(
            get("s3cret", loopback, &local),
            Err(Denied::WrongToken),
            "a token applies to loopback too"
        );
    }

    #[test]
    fn without_a_token_the_host_must_name_this_machine() {
        let listen = Some("192.168.1.5".parse().unwrap());
        for host in [
            "localhost",
            "LOCALHOST:8788",
            "127.0.0.1",
            "127.200.1.1:1",
            "[::1]:8788",
            "[::ffff:127.0.0.1]",
            "192.168.1.5:8788",
        ] {
            assert!(names_this_machine(host, listen), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "0.0.0.0:8788",
            "[::]:8788",
            "192.168.1.6",
            "evil@127.0.0.1",
            "127.0.0.1:80:80",
        ] {
            assert!(!names_this_machine(host, listen), "{host}");
        }
        assert!(!names_this_machine(
            "0.0.0.0",
            Some("0.0.0.0".parse().unwrap())
        ));
    }

    #[test]
    fn writes_need_json_and_no_foreign_origin() {
        let peer: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let post = |h: &[(&str, &str)]| check("", None, peer, &Method::POST, &headers(h));
        let host = ("host", "127.0.0.1:8788");
        let json = ("content-type", "application/json; charset=utf-8");
        assert_eq!(post(&[host, json]), Ok(()));
        assert_eq!(
            post(&[host, json, ("origin", "http://127.0.0.1:8788")]),
            Ok(())
        );
        for origin in [
            "http://evil.example",
            "null",
            "http://localhost:8788",
            "file://",
        ] {
            assert_eq!(
                post(&[host, json, ("origin", origin)]),
                Err(Denied::ForeignOrigin),
                "{origin}"
            );
        }
        for body_type in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/jsonx",
        ] {
            assert_eq!(
                post(&[host, ("content-type", body_type)]),
                Err(Denied::NotJson),
                "{body_type}"
            );
        }
        assert_eq!(post(&[host]), Err(Denied::NotJson));
    }
}
