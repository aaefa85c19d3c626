//! Client connections are reaped: how long one may wait for a request, how many may be
//! open, and what a connection over the cap gets.
//!
//! A connection is either *serving* (a request's head has arrived and its response has not
//! ended: the handler, an upload, a stream however slow, a held request) or *waiting* (just
//! opened, or its last response has ended). Only a waiting connection is ever closed:
//!
//! - one whose next request head has begun but not arrived whole within
//!   `server.header_timeout_secs` of its first byte (a client that sends half a head and
//!   stops: slowloris);
//! - one with no byte of a request for `server.idle_timeout_secs` (idle keep-alive);
//! - at `server.max_connections`, the one that has waited longest, to make room for the new
//!   connection (what nginx does with its idle keep-alive connections when it runs out). If
//!   every connection is serving, the new one is answered `503` with `Retry-After` and
//!   closed, rather than left in the listen backlog where the client only sees a timeout.
//!   A few connections beyond the cap ([`OWN_PATHS_RESERVE`]) are still served for the
//!   proxy's own paths only (`/healthz`, the admin API, the dashboard, `/metrics`), so
//!   that a health check and an operator get through when agents fill every slot; any other
//!   request on them gets the 503.
//!
//! A connection upgraded to a WebSocket ([`Watch::become_socket`]) has no head or idle
//! deadline here: its session keeps its own idle time, serves while an answer is on its
//! way and waits between turns, and closes the socket itself (1001) when the cap evicts it
//! ([`Watch::evicted`]).
//!
//! Three parties share a connection's [`Watch`]: its socket ([`Watched`], which sees bytes
//! arrive and closes the connection when a limit passes), its requests ([`Serving`], held
//! by each response body until the body is sent) and the accepting thread ([`Connections`],
//! which picks the connection to close at the cap).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::config::ServerConfig;

/// File descriptors kept out of the automatic connection cap: the listener, the event
/// loops, the log's database files and its connections, standard streams.
const RESERVED_FDS: u64 = 64;

/// What a refused client is told to wait before it tries again (s).
const RETRY_AFTER_SECS: u64 = 2;

/// Refusals being written at once; past this, a connection over the cap is closed
/// without a word (a flood must not make the refusals themselves hold the descriptors).
const MAX_REFUSING: usize = 64;

/// Connections served beyond the cap, for the proxy's own paths only.
pub const OWN_PATHS_RESERVE: usize = 8;

/// How long a refusal may take to be written and its client to close.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// The limits of `[server]`, with the cap resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header: Duration,
    pub idle: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// `server.max_connections = 0` is half of what the open-file limit leaves after
    /// [`RESERVED_FDS`]: a connection may hold an upstream connection as well.
    pub fn of(config: &ServerConfig) -> Limits {
        let max_connections = match config.max_connections {
            0 => {
                let files = open_file_limit().unwrap_or(1024);
                (files.saturating_sub(RESERVED_FDS) / 2).max(1) as usize
            }
            n => n,
        };
        Limits {
            header: Duration::from_secs(config.header_timeout_secs),
            idle: Duration::from_secs(config.idle_timeout_secs),
            max_connections,
        }
    }
}

/// The process's soft limit of open files (`None`: unlimited or unknown).
#[cfg(unix)]
#[allow(unsafe_code, reason = "getrlimit is a C call")]
fn open_file_limit() -> Option<u64> {
    // SAFETY: getrlimit fills the struct it is given.
    let limit = unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0).then_some(limit)
    }?;
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur as u64)
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<u64> {
    None
}

/// Raises the soft limit of open files to the hard one (many systems start processes at
/// 1,024, a few hundred connections, with a hard limit far above), as servers commonly do
/// at start. Returns the limit now in force.
#[cfg(unix)]
#[allow(unsafe_code, reason = "getrlimit and setrlimit are C calls")]
pub fn raise_open_file_limit() -> Option<u64> {
    // SAFETY: getrlimit fills the struct it is given; setrlimit only reads it.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                tracing::debug!("cannot raise the open-file limit");
            }
        }
    }
    open_file_limit()
}

#[cfg(not(unix))]
pub fn raise_open_file_limit() -> Option<u64> {
    None
}

/// Milliseconds since the first call: the clock of the [`Watch`] fields (an atomic holds
/// them).
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A time not set.
const UNSET: u64 = u64::MAX;

/// One client connection's state, shared by its socket, its requests and the accepting
/// thread.
pub struct Watch {
    id: u64,
    /// Requests whose response has not ended ([`Serving`]); 0: waiting.
    serving: AtomicUsize,
    /// When the connection began waiting: opened, or its last response ended.
    waiting_since: AtomicU64,
    /// When the first byte came while waiting (the next head began); [`UNSET`] if none.
    head_since: AtomicU64,
    /// When the socket's timer will fire; [`UNSET`] before it has one.
    timer_at: AtomicU64,
    /// Set by the accepting thread to close the connection at the cap.
    evicted: AtomicBool,
    /// Admitted beyond the cap ([`Admission::OwnPathsOnly`]): serves the proxy's own paths
    /// only, and is never evicted (it holds no slot under the cap).
    pub own_paths_only: bool,
    /// Upgraded to a WebSocket ([`Watch::become_socket`]): the socket's session keeps its
    /// own idle time and closes it itself (1001) when evicted, so the reader never does.
    socket: AtomicBool,
    /// Tells a socket's session that the cap evicted it.
    evict: tokio::sync::Notify,
    /// The socket's reader: woken to close an evicted connection, and when the connection
    /// starts waiting with no timer set to come (hyper, its read interest already
    /// registered, would not read again before bytes came, and nothing would set one).
    waker: AtomicWaker,
}

/// Why a waiting connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// Its request head did not arrive whole in time.
    Header,
    /// It carried no request for the idle timeout.
    Idle,
    /// It made room at the connection cap.
    Evicted,
}

impl Reason {
    fn message(self) -> &'static str {
        match self {
            Reason::Header => "request head not received within server.header_timeout_secs",
            Reason::Idle => "no request within server.idle_timeout_secs",
            Reason::Evicted => "closed to make room at server.max_connections",
        }
    }
}

impl Watch {
    fn new(id: u64, own_paths_only: bool) -> Watch {
        Watch {
            id,
            serving: AtomicUsize::new(0),
            waiting_since: AtomicU64::new(now_ms()),
            head_since: AtomicU64::new(UNSET),
            timer_at: AtomicU64::new(UNSET),
            evicted: AtomicBool::new(false),
            own_paths_only,
            socket: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
            waker: AtomicWaker::new(),
        }
    }

    /// The connection is now a WebSocket's: no request head or idle deadline applies to it
    /// any more, and an eviction goes to [`Watch::evicted`].
    pub fn become_socket(&self) {
        self.socket.store(true, Ordering::Release);
    }

    /// Resolves when the cap evicts this connection (a WebSocket's session waits on it).
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }

    /// The deadline of a waiting connection (ms, [`now_ms`]'s clock) and what passes at it;
    /// `None` while it serves a request, or once it is a WebSocket's.
    fn deadline(&self, limits: &Limits) -> Option<(u64, Reason)> {
        if self.serving.load(Ordering::Acquire) > 0 || self.socket.load(Ordering::Acquire) {
            return None;
        }
        let head = self.head_since.load(Ordering::Relaxed);
        Some(if head != UNSET {
            (head.saturating_add(millis(limits.header)), Reason::Header)
        } else {
            let since = self.waiting_since.load(Ordering::Relaxed);
            (since.saturating_add(millis(limits.idle)), Reason::Idle)
        })
    }

    /// Bytes arrived: while waiting, the first marks the start of the next head.
    fn arrived(&self) {
        if self.serving.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Relaxed) == UNSET
        {
            self.head_since.store(now_ms(), Ordering::Relaxed);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A request in flight on a connection: made when its head has arrived, dropped with its
/// response body (or with the handler, if the connection goes first). The last one dropped
/// puts the connection back to waiting.
pub struct Serving(Arc<Watch>);

impl Serving {
    /// A request's head has arrived on the connection of `watch`.
    pub fn begin(watch: &Arc<Watch>) -> Serving {
        watch.serving.fetch_add(1, Ordering::AcqRel);
        watch.head_since.store(UNSET, Ordering::Relaxed);
        Serving(watch.clone())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let serving = &self.0.serving;
        let mut count = serving.load(Ordering::Acquire);
        loop {
            // The last one stamps the wait before the count falls to 0, so that whoever
            // sees the connection waiting sees since when.
            let now = now_ms();
            if count == 1 {
                self.0.waiting_since.store(now, Ordering::Relaxed);
            }
            match serving.compare_exchange(
                count,
                count.saturating_sub(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // A timer still to come fires before the idle deadline (it was set for
                    // an earlier one): the reader sets the new deadline then. Otherwise it
                    // must be woken to set one now (about once per idle timeout).
                    let timer_at = self.0.timer_at.load(Ordering::Relaxed);
                    if count == 1 && (timer_at == UNSET || timer_at <= now) {
                        self.0.waker.wake();
                    }
                    return;
                }
                Err(now) => count = now,
            }
        }
    }
}

impl Serving {
    /// `body`, holding this until it is dropped: hyper drops a response body once it has
    /// written the last of it (or the connection is gone).
    pub fn until_sent<B: Body + Unpin>(self, body: B) -> UntilSent<B> {
        UntilSent {
            body,
            _serving: self,
        }
    }
}

/// A response body that keeps its connection serving until it is dropped. Its length and
/// end are the body's own, so that hyper frames it as it would the body (a known length
/// is sent with `content-length`, not chunked).
pub struct UntilSent<B> {
    body: B,
    _serving: Serving,
}

impl<B: Body + Unpin> Body for UntilSent<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A client socket that closes itself (a read error, which ends hyper's connection) when
/// its waiting connection passes a limit or is evicted.
///
/// hyper reads from the socket whenever it waits for a head, and also while it serves one
/// (to notice the client leaving): the limits are checked only when a read finds nothing,
/// and mean nothing while the connection serves. The timer is made once and moved only
/// when it fires before the deadline in force, or when the deadline comes nearer (once per
/// request, when its head begins).
pub struct Watched {
    io: TcpStream,
    watch: Arc<Watch>,
    limits: Limits,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    /// What closes the connection now, if anything; otherwise the timer (and the eviction
    /// waker) will wake `cx`.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<Reason> {
        let watch = &self.watch;
        watch.waker.register(cx.waker());
        if watch.evicted.load(Ordering::Acquire) && !watch.socket.load(Ordering::Acquire) {
            return Some(Reason::Evicted);
        }
        let (deadline, reason) = watch.deadline(&self.limits)?;
        let now = now_ms();
        if now >= deadline {
            return Some(reason);
        }
        self.arm(deadline, now, cx);
        None
    }

    /// Makes sure the timer wakes `cx` by `deadline` (ms, [`now_ms`]'s clock, after `now`).
    /// A timer that will fire between now and then is left as it is: when it fires, the
    /// reader comes back here and sets the next one.
    fn arm(&mut self, deadline: u64, now: u64, cx: &mut Context<'_>) {
        let timer_at = &self.watch.timer_at;
        let set = timer_at.load(Ordering::Relaxed);
        let in_time = set != UNSET && set > now && set <= deadline;
        if self.timer.is_none() || !in_time {
            let at = tokio::time::Instant::now() + Duration::from_millis(deadline - now);
            timer_at.store(deadline, Ordering::Relaxed);
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(at),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        if let Some(timer) = &mut self.timer {
            while timer.as_mut().poll(cx).is_ready() {
                // It fired before the deadline (the two clocks' rounding): once more, shortly.
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + Duration::from_millis(1));
                timer_at.store(now_ms() + 1, Ordering::Relaxed);
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.watch.arrived();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.expired(cx) {
                Some(reason) => {
                    tracing::debug!(reason = reason.message(), "client connection closed");
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        reason.message(),
                    )))
                }
                None => Poll::Pending,
            },
            failed => failed,
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Connections closed at the cap to make room, and refused (admin stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AtCap {
    pub closed_waiting: u64,
    pub refused: u64,
}

/// What a new connection gets ([`Connections::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Served: under the cap, or a waiting connection made room.
    Served,
    /// Beyond the cap, in the reserve: the proxy's own paths only.
    OwnPathsOnly,
    /// The 503 ([`Connections::refuse`]).
    Refused,
}

/// Every open client connection, for the cap.
pub struct Connections {
    pub limits: Limits,
    open: Mutex<HashMap<u64, Arc<Watch>>>,
    next_id: AtomicU64,
    refusing: AtomicUsize,
    /// Connections open in the reserve beyond the cap.
    reserve_open: AtomicUsize,
    /// [`AtCap`]'s counts.
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl Connections {
    pub fn new(limits: Limits) -> Connections {
        Connections {
            limits,
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refusing: AtomicUsize::new(0),
            reserve_open: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Watch>>> {
        // Nothing panics while holding it; a poisoned map is still a consistent one.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection starts being served: its socket, watched, and its [`Watch`] for its
    /// requests. [`Connections::close`] it when it ends.
    pub fn open(&self, io: TcpStream, admission: Admission) -> (Watched, Arc<Watch>) {
        let watch = Arc::new(Watch::new(
            self.next_id.fetch_add(1, Ordering::Relaxed),
            admission == Admission::OwnPathsOnly,
        ));
        self.lock().insert(watch.id, watch.clone());
        let watched = Watched {
            io,
            watch: watch.clone(),
            limits: self.limits,
            timer: None,
        };
        (watched, watch)
    }

    pub fn close(&self, watch: &Watch) {
        self.lock().remove(&watch.id);
        if watch.own_paths_only {
            self.reserve_open.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// What a new connection gets, `open` being open now under the cap: served when under
    /// it, or once the connection that has waited longest is told to close; else a place
    /// in the reserve for the proxy's own paths while one is free; else the 503.
    pub fn admit(&self, open: usize) -> Admission {
        if open < self.limits.max_connections {
            return Admission::Served;
        }
        let oldest = self
            .lock()
            .values()
            .filter(|w| {
                !w.own_paths_only
                    && w.serving.load(Ordering::Acquire) == 0
                    && !w.evicted.load(Ordering::Relaxed)
            })
            .min_by_key(|w| w.waiting_since.load(Ordering::Relaxed))
            .cloned();
        let Some(oldest) = oldest else {
            if self.reserve_open.fetch_add(1, Ordering::AcqRel) < OWN_PATHS_RESERVE {
                return Admission::OwnPathsOnly;
            }
            self.reserve_open.fetch_sub(1, Ordering::AcqRel);
            return Admission::Refused;
        };
        oldest.evicted.store(true, Ordering::Release);
        oldest.waker.wake();
        // A WebSocket between turns closes itself, with 1001.
        oldest.evict.notify_one();
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Admission::Served
    }

    /// The answer to a request for a path not the proxy's own on a connection of the
    /// reserve: the refusal's 503, after which the connection closes.
    pub fn refuse_request(&self) -> axum::response::Response {
        self.count_refusal();
        let body = refusal_body(self.limits);
        let mut response = axum::response::Response::new(axum::body::Body::from(body));
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(RETRY_AFTER_SECS),
        );
        headers.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        response
    }

    /// Counts a refusal, and says so in the process log now and then.
    fn count_refusal(&self) {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed);
        if refused.is_multiple_of(1000) {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                refused = refused + 1,
                "connection refused: every connection is serving a request"
            );
        }
    }

    /// Answers a connection over the cap with a 503 and closes it, off the accepting loop.
    pub fn refuse(self: &Arc<Self>, stream: TcpStream) {
        self.count_refusal();
        if self.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::AcqRel);
            return; // dropped: closed
        }
        let connections = self.clone();
        crate::spawn::task("refuse connection", async move {
            let _ = tokio::time::timeout(REFUSAL_TIME, refusal(stream, connections.limits)).await;
            connections.refusing.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// What the cap did so far.
    pub fn at_cap(&self) -> AtCap {
        AtCap {
            closed_waiting: self.evicted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// The 503's body (in no API's shape in particular: the request is not read, so it
/// carries the fields each SDK looks for).
fn refusal_body(limits: Limits) -> String {
    let message = format!(
        "loopwarden: too many open connections (server.max_connections = {}); retry in {RETRY_AFTER_SECS} s",
        limits.max_connections
    );
    serde_json::json!({
        "type": "error",
        "error": {"type": "overloaded_error", "code": 503, "status": "UNAVAILABLE", "message": message},
    })
    .to_string()
}

/// Writes the 503 (in no API's shape in particular: the request is not read, so the body
/// carries the fields each SDK looks for) and waits for the client to close, so that the
/// close is not a reset that could discard the answer before the client reads it.
async fn refusal(mut stream: TcpStream, limits: Limits) -> io::Result<()> {
    let body = refusal_body(limits);
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: {RETRY_AFTER_SECS}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 4096];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header: Duration::from_secs(30),
            idle: Duration::from_secs(120),
            max_connections: 2,
        }
    }

    fn watch() -> Arc<Watch> {
        let watch = Watch::new(0, false);
        watch.waiting_since.store(1_000, Ordering::Relaxed);
        Arc::new(watch)
    }

    #[test]
    fn a_waiting_connection_has_the_idle_deadline_until_a_head_begins() {
        let w = watch();
        assert_eq!(w.deadline(&limits()), Some((121_000, Reason::Idle)));
        w.head_since.store(5_000, Ordering::Relaxed);
        assert_eq!(w.deadline(&limits()), Some((35_000, Reason::Header)));
    }

    #[test]
    fn a_serving_connection_has_no_deadline_and_waits_again_when_its_last_request_ends() {
        let w = watch();
        w.head_since.store(5_000, Ordering::Relaxed);
        let first = Serving::begin(&w);
        let second = Serving::begin(&w);
        assert_eq!(w.deadline(&limits()), None);
        // Bytes of a body (or of a pipelined request) while serving start no head.
        w.arrived();
        assert_eq!(w.head_since.load(Ordering::Relaxed), UNSET);
        drop(first);
        assert_eq!(w.deadline(&limits()), None);
        drop(second);
        let (deadline, reason) = w.deadline(&limits()).unwrap();
        assert_eq!(reason, Reason::Idle);
        assert!(deadline >= now_ms() + 119_000);
    }

    #[test]
    fn the_automatic_cap_leaves_room_for_an_upstream_connection_each() {
        let config = ServerConfig {
            max_connections: 0,
            ..ServerConfig::default()
        };
        let files = open_file_limit().unwrap_or(1024);
        assert_eq!(
            Limits::of(&config).max_connections as u64,
            ((files - RESERVED_FDS) / 2).max(1)
        );
        let config = ServerConfig {
            max_connections: 7,
            ..ServerConfig::default()
        };
        assert_eq!(Limits::of(&config).max_connections, 7);
    }
}
