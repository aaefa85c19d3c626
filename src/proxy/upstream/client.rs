//! The upstream client: per serving thread, a small pool of HTTP/1.1 keep-alive connections
//! to each upstream origin, each driven by hyper's `client::conn::http1`.
//!
//! Why not hyper-util's pooled client: its pool (a SipHash map keyed by scheme and
//! authority, checkout and put-back futures, the per-request URI and header work) cost
//! ~13 k instructions per 8.8 KB request, 14 % of the serving threads' work, for features
//! the proxy does not use (HTTP/2, any host): BENCHMARKS.md, "The upstream client
//! (session 4)". Here a request takes the most recently
//! returned idle connection of its origin (or opens one), sends, and the connection comes
//! back to the pool when the response body has ended ([`ResponseBody`]): only then is it
//! ready for another request, so a connection still streaming is never handed out twice.
//!
//! The one retry: a pooled connection the upstream closed while it sat idle (the keep-alive
//! race) gives the request back unsent (`SendRequest::try_send_request`), and it is sent
//! once more on a fresh connection. A request that may have reached the upstream is never
//! sent again: the error goes to the client.
//!
//! The model APIs all speak HTTP/1.1; TLS offers only `http/1.1` by ALPN.
//!
//! Every connection is opened by one connector, which goes through the outbound proxy when
//! `crate::egress` says so (a `CONNECT` tunnel, TLS to the upstream inside it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::config::{extra_roots, UpstreamConfig};
use crate::egress::{Egress, TunnelError, Tunnelling};
use crate::proxy::serve::route::Upstream;
use crate::request_bytes::RequestBytes;

/// Idle connections kept per origin and serving thread; one more returned is closed. A
/// serving thread rarely has more requests in flight to one API than this.
pub const MAX_IDLE_PER_ORIGIN: usize = 64;

type Connector = HttpsConnector<Tunnelling>;
type Sender = SendRequest<Outgoing>;

/// One serving thread's upstream client (cheap to clone: a handle to the same pool).
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

struct Shared {
    connector: Connector,
    /// Which connections go through the outbound proxy (the connector's own decision; kept
    /// here to say so when one times out).
    egress: Arc<Egress>,
    /// Over TCP connect and TLS handshake together.
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// A response body silent for this long is cut ([`Stall`]).
    stream_idle: Duration,
    max_idle: usize,
    /// Each configured base, indexed by `Upstream as usize`: `None` when it is not a URL.
    bases: [Option<Base>; 3],
    /// Origins' connection details; bases with the same scheme and authority share one.
    origins: Vec<Origin>,
    idle: Mutex<Idle>,
    opened: AtomicU64,
    retried: AtomicU64,
}

struct Base {
    origin: usize,
    /// The base URL's path (no trailing slash), put before each forwarded path.
    prefix: String,
}

struct Origin {
    /// `scheme://authority/`, what the connector dials.
    dial: Uri,
    host: HeaderValue,
}

struct Idle {
    /// Per origin, oldest first.
    lists: Vec<Vec<IdleConn>>,
    /// A task that closes expired idle connections is running.
    reaper: bool,
}

struct IdleConn {
    sender: Sender,
    since: Instant,
}

/// Connections opened and requests resent so far (tests, diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub opened: u64,
    /// Requests a closed pooled connection gave back, sent again on a fresh one.
    pub retried: u64,
    /// Idle connections in the pool now.
    pub idle: usize,
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the upstream base URL is not a valid URL")]
    BadBase,
    #[error("not an http(s) URL")]
    BadUrl,
    #[error("cannot connect to {dial}")]
    Connect {
        dial: Uri,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot connect to {dial}: no connection within {ms} ms{}", via_proxy(.via))]
    ConnectTimeout {
        dial: Uri,
        ms: u128,
        /// The outbound proxy the connection went through (`crate::egress`), if any.
        via: Option<String>,
    },
    /// The outbound proxy (`crate::egress`) could not be reached or gave no tunnel.
    #[error("cannot connect to {dial} through the outbound proxy")]
    Proxy {
        dial: Uri,
        #[source]
        source: TunnelError,
    },
    #[error("upstream connection failed")]
    Http(#[from] hyper::Error),
}

fn via_proxy(via: &Option<String>) -> String {
    via.as_ref()
        .map(|proxy| format!(" through the outbound proxy {proxy}"))
        .unwrap_or_default()
}

impl Error {
    /// What the client's 502 says: which hop could not be reached.
    pub fn unreachable_message(&self, upstream: Upstream) -> String {
        match self {
            Error::Proxy { source, .. } => format!(
                "loopwarden: the {} upstream could not be reached: {source}",
                upstream.as_str()
            ),
            Error::ConnectTimeout { via: Some(_), .. } => format!(
                "loopwarden: the {} upstream could not be reached: {self}",
                upstream.as_str()
            ),
            _ => format!(
                "loopwarden: the {} upstream could not be reached",
                upstream.as_str()
            ),
        }
    }
}

impl Client {
    /// A client trusting the built-in roots and those of `upstream.ca_file`.
    pub fn new(config: &UpstreamConfig) -> Client {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if !config.ca_file.is_empty() {
            // Checked when the config was loaded; gone or changed since, the built-in roots
            // still serve, and the log says why the private CA is not trusted.
            match extra_roots(&config.ca_file) {
                Ok(certs) => {
                    let (_, ignored) = roots.add_parsable_certificates(certs);
                    if ignored > 0 {
                        tracing::warn!(ignored, file = %config.ca_file, "CA certificates that cannot be used were left out");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "upstream.ca_file not trusted"),
            }
        }
        let tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client::with_tls(config, tls, MAX_IDLE_PER_ORIGIN)
    }

    /// Posts a JSON `body` to `url`, any http(s) URL (a webhook: rare, to a host that is not
    /// an upstream), on a connection of its own that closes with the answer; the answer's
    /// status. The caller bounds how long it waits.
    pub async fn post_json(&self, url: &Uri, body: Bytes) -> Result<http::StatusCode, Error> {
        let (Some(scheme), Some(authority)) = (url.scheme(), url.authority()) else {
            return Err(Error::BadUrl);
        };
        let dial = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| Error::BadUrl)?;
        let mut sender = self.shared.dial(&dial).await?;
        let path = url.path_and_query().map_or("/", |p| p.as_str());
        let request = http::Request::post(path)
            .header(HOST, authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONNECTION, "close")
            .body(Outgoing::new(RequestBytes::from(body)))
            .map_err(|_| Error::BadUrl)?;
        let response = sender.send_request(request).await?;
        Ok(response.status())
    }

    /// [`Client::new`] trusting what `tls` trusts (its ALPN is set here), keeping at most
    /// `max_idle` idle connections per origin.
    pub fn with_tls(
        config: &UpstreamConfig,
        mut tls: rustls::ClientConfig,
        max_idle: usize,
    ) -> Client {
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        // Streamed events are small writes; Nagle's algorithm would hold them back.
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        // The model APIs all speak HTTP/1.1, and this client speaks nothing else.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Checked when the config was loaded.
        let egress = Egress::of(&config.egress()).unwrap_or_else(|(_, problem)| {
            tracing::warn!(%problem, "upstream.proxy not usable; connecting directly");
            Egress::default()
        });
        let egress = Arc::new(egress);
        let tunnelling = Tunnelling {
            direct: http,
            egress: egress.clone(),
        };
        let connector = Connector::from((tunnelling, tls));
        let mut origins: Vec<Origin> = Vec::new();
        let mut base = |url: &str| {
            let uri: Uri = url.parse().ok()?;
            let scheme = uri.scheme()?.clone();
            let authority = uri.authority()?.clone();
            let dial = Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query("/")
                .build()
                .ok()?;
            let origin = match origins.iter().position(|o| o.dial == dial) {
                Some(i) => i,
                None => {
                    // What hyper-util's client sent: the port only when not the scheme's default.
                    let default_port = if scheme == http::uri::Scheme::HTTPS {
                        443
                    } else {
                        80
                    };
                    let host = match authority.port_u16() {
                        Some(port) if port != default_port => {
                            format!("{}:{port}", authority.host())
                        }
                        _ => authority.host().to_string(),
                    };
                    origins.push(Origin {
                        dial,
                        host: HeaderValue::from_str(&host).ok()?,
                    });
                    origins.len() - 1
                }
            };
            Some(Base {
                origin,
                prefix: uri.path().trim_end_matches('/').to_string(),
            })
        };
        let bases = [
            base(&config.openai),
            base(&config.anthropic),
            base(&config.gemini),
        ];
        let lists = origins.iter().map(|_| Vec::new()).collect();
        Client {
            shared: Arc::new(Shared {
                connector,
                egress,
                connect_timeout,
                idle_timeout: Duration::from_secs(config.pool_idle_timeout_secs),
                stream_idle: Duration::from_secs(config.stream_idle_secs),
                max_idle,
                bases,
                origins,
                idle: Mutex::new(Idle {
                    lists,
                    reaper: false,
                }),
                opened: AtomicU64::new(0),
                retried: AtomicU64::new(0),
            }),
        }
    }

    /// The request target for `path` (and `query`) on `upstream`'s base: origin-form, the
    /// base's own path first. `None` when the base or the path is not usable.
    pub fn target(&self, upstream: Upstream, path: &str, query: Option<&str>) -> Option<Uri> {
        let prefix = &self.shared.bases[upstream as usize].as_ref()?.prefix;
        let mut target =
            String::with_capacity(prefix.len() + path.len() + 1 + query.map_or(0, str::len));
        target.push_str(prefix);
        target.push_str(path);
        if let Some(q) = query {
            target.push('?');
            target.push_str(q);
        }
        Uri::try_from(target).ok()
    }

    /// Sends `request` (its URI from [`Client::target`]; the `Host` header is set here) over
    /// an idle connection to `upstream`'s origin, or a new one.
    pub async fn send(
        &self,
        upstream: Upstream,
        mut request: http::Request<Outgoing>,
    ) -> Result<http::Response<ResponseBody>, Error> {
        let shared = &self.shared;
        let origin = self.address(upstream, &mut request).ok_or(Error::BadBase)?;
        if let Some(mut sender) = shared.checkout(origin) {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.answer(response, sender, origin)),
                Err(mut e) => match e.take_message() {
                    // Closed before the request was written: it never left, resend it.
                    Some(unsent) => {
                        tracing::debug!(error = %e.error(), "pooled upstream connection closed; resending on a new one");
                        shared.retried.fetch_add(1, Ordering::Relaxed);
                        request = unsent;
                    }
                    None => return Err(e.into_error().into()),
                },
            }
        }
        // Rare (no open connection in the pool): boxed, so that the future of every request,
        // which the handler boxes and so copies whole, does not carry room for a TCP and TLS
        // connect (several KB).
        let mut sender = Box::pin(shared.connect(origin)).await?;
        let response = sender.send_request(request).await?;
        Ok(self.answer(response, sender, origin))
    }

    /// Sends `request`, which asks to upgrade its connection (a WebSocket: its URI from
    /// [`Client::target`], `Host` set here), over a new connection of its own that is never
    /// pooled: once the upstream agrees (101), `hyper::upgrade::on` the answer gives the
    /// socket. The caller bounds how long it waits.
    pub async fn upgrade(
        &self,
        upstream: Upstream,
        mut request: http::Request<Outgoing>,
    ) -> Result<http::Response<Incoming>, Error> {
        let shared = &self.shared;
        let origin = self.address(upstream, &mut request).ok_or(Error::BadBase)?;
        let origin = &shared.origins[origin];
        let io = shared.open(&origin.dial).await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        crate::spawn::task("upstream upgrade", async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        shared.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender.send_request(request).await?)
    }

    /// The origin `upstream`'s requests go to, with `request`'s `Host` set to it; `None`
    /// for an upstream whose base was not usable.
    fn address<B>(&self, upstream: Upstream, request: &mut http::Request<B>) -> Option<usize> {
        let shared = &self.shared;
        let origin = shared.bases[upstream as usize].as_ref()?.origin;
        request
            .headers_mut()
            .insert(HOST, shared.origins[origin].host.clone());
        Some(origin)
    }

    fn answer(
        &self,
        response: http::Response<Incoming>,
        sender: Sender,
        origin: usize,
    ) -> http::Response<ResponseBody> {
        response.map(|inner| ResponseBody {
            inner,
            stall: Stall::new(self.shared.stream_idle),
            back: Some(Back {
                sender,
                shared: self.shared.clone(),
                origin,
            }),
        })
    }

    pub fn stats(&self) -> Stats {
        let shared = &self.shared;
        Stats {
            opened: shared.opened.load(Ordering::Relaxed),
            retried: shared.retried.load(Ordering::Relaxed),
            idle: shared.lock_idle().lists.iter().map(Vec::len).sum(),
        }
    }
}

impl Shared {
    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        // Nothing panics while holding it; a poisoned pool is still a consistent one.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently returned idle connection of `origin` that is still open (the one
    /// least likely to have been closed by the upstream's own idle timeout).
    fn checkout(&self, origin: usize) -> Option<Sender> {
        let mut idle = self.lock_idle();
        let list = &mut idle.lists[origin];
        while let Some(conn) = list.pop() {
            if conn.since.elapsed() >= self.idle_timeout {
                // The others went idle earlier still.
                list.clear();
                return None;
            }
            // Not ready only once closed: connections are returned ready.
            if conn.sender.is_ready() {
                return Some(conn.sender);
            }
        }
        None
    }

    async fn connect(&self, origin: usize) -> Result<Sender, Error> {
        let sender = self.dial(&self.origins[origin].dial).await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    /// A new HTTP/1.1 connection to `dial` (`scheme://authority/`), driven by a task of its
    /// own until it closes.
    async fn dial(&self, dial: &Uri) -> Result<Sender, Error> {
        let io = self.open(dial).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        crate::spawn::task("upstream connection", async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// A new TCP (and TLS) connection to `dial` (`scheme://authority/`), within the connect
    /// timeout.
    async fn open(
        &self,
        dial: &Uri,
    ) -> Result<<Connector as tower::Service<Uri>>::Response, Error> {
        let connecting = tower::ServiceExt::oneshot(self.connector.clone(), dial.clone());
        match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(io)) => Ok(io),
            Ok(Err(source)) => match source.downcast::<TunnelError>() {
                Ok(tunnel) => Err(Error::Proxy {
                    dial: dial.clone(),
                    source: *tunnel,
                }),
                Err(source) => Err(Error::Connect {
                    dial: dial.clone(),
                    source,
                }),
            },
            Err(_) => Err(Error::ConnectTimeout {
                dial: dial.clone(),
                ms: self.connect_timeout.as_millis(),
                via: self.egress.proxy_for(dial).map(|p| p.to_string()),
            }),
        }
    }

    /// Takes back a connection whose response body has ended.
    fn checkin(self: Arc<Self>, mut sender: Sender, origin: usize) {
        if sender.is_closed() {
            return;
        }
        if sender.is_ready() {
            self.keep(sender, origin);
            return;
        }
        // The connection has not yet taken in the end of the answer (it is usually ready by
        // the time the body's end reaches here): wait for it off the request path.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wait = self.idle_timeout;
        runtime.spawn(async move {
            let ready = std::future::poll_fn(|cx| sender.poll_ready(cx));
            if let Ok(Ok(())) = tokio::time::timeout(wait, ready).await {
                self.keep(sender, origin);
            }
        });
    }

    fn keep(self: Arc<Self>, sender: Sender, origin: usize) {
        let mut idle = self.lock_idle();
        let list = &mut idle.lists[origin];
        if list.len() >= self.max_idle || self.idle_timeout.is_zero() {
            return; // dropped: the connection closes
        }
        list.push(IdleConn {
            sender,
            since: Instant::now(),
        });
        if !idle.reaper {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                idle.reaper = true;
                runtime.spawn(reap(Arc::downgrade(&self), self.idle_timeout));
            }
        }
    }
}

/// Closes idle connections once they have been idle `timeout` (checked every `timeout`, so
/// they go between one and two timeouts after their last use); ends when none are left.
async fn reap(shared: Weak<Shared>, timeout: Duration) {
    loop {
        tokio::time::sleep(timeout).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut idle = shared.lock_idle();
        let now = Instant::now();
        for list in &mut idle.lists {
            list.retain(|c| now.duration_since(c.since) < timeout && !c.sender.is_closed());
        }
        if idle.lists.iter().all(Vec::is_empty) {
            idle.reaper = false;
            return;
        }
    }
}

/// The upstream's response body; its connection goes back to the pool when it has ended.
/// Dropped before its end (the client went away), the connection is closed with it, which
/// also tells the upstream to stop generating. A body from which nothing has arrived for
/// `upstream.stream_idle_secs` ends with [`BodyError::Stalled`]: its connection is dropped
/// as a broken one is, and the client sees the same break.
#[derive(Debug)]
pub struct ResponseBody {
    inner: Incoming,
    stall: Stall,
    back: Option<Back>,
}

/// How an upstream response body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The connection broke or the framing was wrong.
    #[error("the upstream response broke off")]
    Broken(#[from] hyper::Error),
    /// Nothing arrived for this long.
    #[error("the upstream response stalled: nothing arrived for {0:?}")]
    Stalled(Duration),
}

/// The silence of a response body: since when it has been waiting for the upstream, and
/// the timer that ends the wait.
///
/// Cheap on the way of every frame: a frame only clears `waiting_since`; the clock is read
/// once per wait, when the body is first found waiting. The timer is made at the first wait
/// and moved only when it fires early (it was set for an earlier wait), so a stream of many
/// frames costs no timer updates.
#[derive(Debug)]
struct Stall {
    limit: Duration,
    waiting_since: Option<tokio::time::Instant>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The task the timer wakes (it was last polled with this waker): while the timer has
    /// not elapsed, that task is woken by it without polling it again, which a stream
    /// would do at every wait between its events.
    waker: Option<std::task::Waker>,
    /// Once fired, the body stays stalled.
    fired: bool,
}

impl Stall {
    fn new(limit: Duration) -> Stall {
        Stall {
            limit,
            waiting_since: None,
            timer: None,
            waker: None,
            fired: false,
        }
    }

    /// Something arrived.
    fn progress(&mut self) {
        self.waiting_since = None;
    }

    /// The body is waiting for the upstream: whether it has waited `limit` (else the timer
    /// will wake `cx` when it has).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.fired {
            return true;
        }
        let since = *self
            .waiting_since
            .get_or_insert_with(tokio::time::Instant::now);
        let deadline = since + self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        let armed = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if armed && !timer.is_elapsed() {
            return false;
        }
        if !armed {
            self.waker = Some(cx.waker().clone());
        }
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                self.fired = true;
                return true;
            }
            timer.as_mut().reset(deadline);
        }
        false
    }
}

struct Back {
    sender: Sender,
    shared: Arc<Shared>,
    origin: usize,
}

impl std::fmt::Debug for Back {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Back")
            .field("origin", &self.origin)
            .finish()
    }
}

impl ResponseBody {
    fn ended(&mut self) {
        if let Some(Back {
            sender,
            shared,
            origin,
        }) = self.back.take()
        {
            shared.checkin(sender, origin);
        }
    }
}

/// A request body on its way upstream: the body's pieces ([`RequestBytes`]), a frame each,
/// neither copied (hyper writes them with one vectored write).
pub struct Outgoing {
    /// The pieces not sent yet, in order (`None` once sent, or when empty).
    pieces: [Option<Bytes>; 2],
}

impl Outgoing {
    pub fn new(body: RequestBytes) -> Outgoing {
        let (head, tail) = body.into_pieces();
        let some = |piece: Bytes| (!piece.is_empty()).then_some(piece);
        Outgoing {
            pieces: [some(head), some(tail)],
        }
    }
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let next = self.pieces.iter_mut().find_map(Option::take);
        Poll::Ready(next.map(|piece| Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.iter().all(Option::is_none)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.pieces.iter().flatten().map(|p| p.len() as u64).sum())
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.ended(),
            Poll::Ready(Some(Ok(_))) => this.stall.progress(),
            // A broken connection is never reused.
            Poll::Ready(Some(Err(_))) => this.back = None,
            Poll::Pending => {
                if this.stall.expired(cx) {
                    // Dropped with the body: the upstream connection closes.
                    this.back = None;
                    return Poll::Ready(Some(Err(BodyError::Stalled(this.stall.limit))));
                }
            }
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(BodyError::Broken)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // The server may drop a body it knows is complete without polling its end.
        if self.inner.is_end_stream() {
            self.ended();
        }
    }
}

thread_local! {
    /// The client of a serving thread other than the one that started the proxy
    /// (`crate::proxy::start`, which uses `App::client`): a request and its upstream connection stay
    /// on the request's thread, since a connection is driven by a task of the thread that
    /// opened it.
    static THREAD_CLIENT: std::cell::OnceCell<Client> = const { std::cell::OnceCell::new() };
}

/// Gives the calling thread its own upstream client (call before it serves requests).
pub fn use_thread_client(client: Client) {
    THREAD_CLIENT.with(|local| {
        let _ = local.set(client);
    });
}

/// The calling thread's client, else `fallback` (the starting thread's).
pub fn thread_client(fallback: &Client) -> Client {
    THREAD_CLIENT.with(|local| local.get().unwrap_or(fallback).clone())
}
