//! The HTTP side, in rooms, each reached through its `mod.rs`; arrows run down this list:
//!
//! - this file: the proxy started and stopped ([`start`], [`Running`]), each serving
//!   thread's loop, which hands a request to the operator's router or to [`forward`];
//! - [`operator`]: what the proxy answers itself (admin API, dashboard, `/metrics`);
//! - [`forward`]: one request's path: the body read once, the analysis of the conversation
//!   (through [`memory`], so that only new messages cost work), the ruling carried out, the
//!   bytes sent upstream, the answer streamed back, charged and logged off the path; the
//!   same for each turn of a Responses WebSocket; and the state every request shares
//!   ([`forward::App`]);
//! - [`upstream`]: the pooled client to the model APIs, the Responses answers kept for
//!   requests that continue one by id, webhooks;
//! - [`serve`]: client connections and their reaping, TLS, where a request goes
//!   ([`serve::route`]), the spread over serving threads, the health check;
//! - [`memory`], [`identity`]: what the proxy remembers of each live conversation, and
//!   which conversation a request belongs to.
//!
//! Nothing here decides what happens to a request: that is `crate::intervene::ruling`.

pub mod forward;
pub mod identity;
pub mod memory;
pub mod operator;
pub mod serve;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::Router;
use futures_util::future::{Either, FutureExt};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::config::{Config, WebSocketMode};
use crate::store::{Store, StoreOptions};
use forward::{App, Place};
use serve::{Admission, Cut, Spread};

pub use serve::ServeArgs;

/// How a stop went ([`Running::shutdown`]): what the log could not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    pub log: crate::store::Closed,
}

impl Stopped {
    /// `loopwarden serve`'s exit status: 0 when everything was written; 75 (EX_TEMPFAIL)
    /// when records were spilled and the next start writes them; 74 (EX_IOERR) when records
    /// were lost (not written and not spilled, or the writer did not finish).
    pub fn exit_code(&self) -> u8 {
        let log = &self.log;
        if log.lost > 0 || log.unfinished {
            EXIT_LOG_LOST
        } else if log.spilled > 0 {
            EXIT_LOG_SPILLED
        } else {
            0
        }
    }
}

/// The end of a stop's grace kept for writing the log, at most: the requests in flight get
/// the rest, less a quarter of it for shorter graces.
const LOG_RESERVE_MAX: Duration = Duration::from_secs(5);

/// `loopwarden serve`'s exit status when log records were spilled at shutdown.
pub const EXIT_LOG_SPILLED: u8 = 75;
/// `loopwarden serve`'s exit status when log records were lost at shutdown.
pub const EXIT_LOG_LOST: u8 = 74;

/// A running proxy (in-process): its address, and a handle to stop it cleanly.
pub struct Running {
    addr: SocketAddr,
    /// One per serving thread; sending (or dropping) stops that thread's server gracefully.
    shutdown: Vec<oneshot::Sender<()>>,
    /// The server on the runtime that called [`start`].
    server: JoinHandle<std::io::Result<()>>,
    /// The other serving threads, each answering once its server has finished.
    others: Vec<oneshot::Receiver<std::io::Result<()>>>,
    app: Arc<App>,
    /// The sync with the other replicas (a shared database only).
    replicas: Option<crate::replicas::Replicas>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` with TLS on the listener.
    pub fn url(&self) -> String {
        format!("{}://{}", scheme(&self.app.config), self.addr)
    }

    pub fn store(&self) -> &Store {
        &self.app.store
    }

    /// Stops within `server.shutdown_grace_secs`: drains for `server.drain_secs` first
    /// ([`Running::drain`]), then stops accepting, answers every held request at once (its
    /// timeout's verdict), lets the requests and streams in flight finish within the grace
    /// and cuts what remains near its end ([`LOG_RESERVE_MAX`]), then gives the log what is
    /// left of it (what it cannot write by then is spilled, or counted lost).
    pub async fn shutdown(mut self) -> anyhow::Result<Stopped> {
        let grace = Duration::from_secs(self.app.config.server.shutdown_grace_secs);
        let deadline = std::time::Instant::now() + grace;
        self.drain().await;
        // The log's last moments are kept for it: what is cut is logged after the cut.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let cut_at = deadline - (left / 4).min(LOG_RESERVE_MAX);
        let log_before = self.app.store.health();
        let held = self.app.interventions.pending.release_all();
        if held > 0 {
            tracing::info!(
                held,
                "held requests released by shutdown: answered with their timeout's verdict"
            );
        }
        for stop in self.shutdown.drain(..) {
            let _ = stop.send(());
        }
        let app = self.app.clone();
        {
            let mut server = std::pin::pin!(self.stop_serving());
            tokio::select! {
                served = &mut server => served,
                _ = tokio::time::sleep_until(cut_at.into()) => {
                    tracing::warn!(
                        connections = app.spread.total(),
                        "shutdown grace over: cutting the connections still open"
                    );
                    app.cut.now();
                    server.await
                }
            }?;
        }
        if let Some(replicas) = &self.replicas {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if tokio::time::timeout(left, replicas.last_sync())
                .await
                .is_err()
            {
                tracing::warn!(
                    "the last sync with the other replicas did not finish in the grace period"
                );
            }
        }
        let log = self.app.store.close_by(deadline, &log_before).await;
        if log.unfinished {
            tracing::error!("the log writer did not finish by the end of the shutdown grace: the records it still held are lost");
        }
        Ok(Stopped { log })
    }

    /// The first part of a stop (`server.drain_secs`, at most half the grace): everything
    /// is still served, new connections included, but `/readyz` answers 503 and each answer
    /// closes its connection, so that a load balancer polling `/readyz` (a Kubernetes
    /// readiness probe) takes this replica out, and its clients reconnect elsewhere, before
    /// the listener closes.
    async fn drain(&self) {
        self.app
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let drain_secs = self.app.config.server.drain_secs;
        if drain_secs > 0 {
            tracing::info!(
                drain_secs,
                "draining: /readyz answers 503 while requests are still served"
            );
            tokio::time::sleep(Duration::from_secs(drain_secs)).await;
        }
    }

    /// Waits for every serving thread to finish its connections.
    async fn stop_serving(&mut self) -> anyhow::Result<()> {
        (&mut self.server).await??;
        for done in self.others.drain(..) {
            // No answer: the thread is gone already (it cannot hold requests either).
            if let Ok(result) = done.await {
                result?;
            }
        }
        Ok(())
    }

    /// Waits for the log to hold everything finished so far (tests, admin snapshots).
    pub async fn flush_log(&self) {
        self.app.store.flush().await;
    }

    /// Reads the config file again and puts its policies in force when it is valid (what
    /// SIGHUP does).
    pub fn reload(&self, trigger: &'static str) -> crate::reload::Reload {
        self.app.policies.reload(trigger)
    }
}

/// The log, with what the last stop spilled written into it, and spilling to the same file
/// at the next stop.
async fn open_store(config: &Config) -> anyhow::Result<Store> {
    let store = Store::open(
        &config.store.db,
        StoreOptions {
            queue_capacity: config.store.queue_capacity,
            batch_size: config.store.batch_size,
            batch_window: StoreOptions::BATCH_WINDOW,
            retry_rows: config.store.retry_rows,
        },
    )
    .await?;
    let spill = config.store.spill_path();
    store.take_in_spill(&spill).await?;
    store.spill_to(spill);
    Ok(store)
}

/// Opens the log, binds the listener and serves until [`Running::shutdown`].
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let listen = config
        .listen_addr()
        .map_err(|e| anyhow::anyhow!("config key `server.listen`: {e}"))?;
    let tls = config
        .server
        .tls_acceptor()
        .map_err(|(key, problem)| anyhow::anyhow!("config key `{key}`: {problem}"))?;
    // What the last stop could not write goes in first: the spend restored below counts it.
    let store = open_store(&config).await?;
    let threads = match config.server.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let cannot_listen = |e: std::io::Error| anyhow::anyhow!("cannot listen on {listen}: {e}");
    let listener = TcpListener::bind(listen).await.map_err(cannot_listen)?;
    let addr = listener.local_addr()?;
    let (spread, handed) = Spread::new(threads);
    let idle = Duration::from_secs(config.cache.idle_secs);
    let ledger = crate::budget::Ledger::new(config.prices.clone());
    // Replicas sharing a database share spend through it instead (`crate::replicas`): the
    // log's sums would count the others' answers twice.
    if !store.is_shared() {
        let restored = ledger.restore_from(&store, crate::store::now_ms()).await?;
        tracing::debug!(conversations = restored, "spend restored from the log");
    }
    let metrics = Arc::new(crate::metrics::Metrics::default());
    crate::egress::log_in_use(&config.upstream.egress());
    let client = upstream::Client::new(&config.upstream);
    let interventions =
        crate::interventions::Interventions::open(store.clone(), ledger.clone(), metrics.clone())
            .await?
            .with_alerts(alert_sink(
                client.clone(),
                public_url(&config, addr),
                metrics.clone(),
            ));
    let prices = ledger.clone();
    let policies = Arc::new(crate::reload::Live::new(
        config.policy_set()?,
        config.clone(),
        // The price table is the one setting outside the policies that a reload applies.
        Box::new(move |config: &Config| prices.set_prices(config.prices.clone())),
    ));
    if config.source.is_some() {
        crate::reload::watch(Arc::downgrade(&policies));
    }
    let traces = Arc::new(crate::telemetry::Traces::start(&config.telemetry));
    let app = Arc::new(App {
        ledger,
        interventions,
        policies,
        client,
        analyser: forward::Analyser {
            memory: memory::Memory::new(&config.cache),
        },
        responses: Arc::new(upstream::ResponseChain::new(
            upstream::HTTP_ANSWERS,
            upstream::HTTP_MAX_BYTES,
        )),
        store,
        connections: Arc::new(serve::Connections::new(serve::Limits::of(&config.server))),
        config,
        spread,
        metrics,
        traces,
        cut: Cut::default(),
        stopping: std::sync::atomic::AtomicBool::new(false),
        tls,
    });
    // Runs and stored answers outlive this process, in the log's store.
    app.analyser.memory.lineage.keep_in(app.store.clone());
    app.responses.keep_in(app.store.clone());
    spawn_sweeper(Arc::downgrade(&app), idle);
    let replicas = start_replicas(&app).await;
    crate::store::redact::warm_up();

    let router = operator::router(app.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = crate::spawn::task(
        "serve",
        serve(
            Incoming::Listener(listener),
            0,
            app.clone(),
            router.clone(),
            stopped,
        ),
    );
    let mut shutdown = vec![stop];
    let mut others = Vec::new();
    for (i, handed) in handed.into_iter().enumerate() {
        let (stop, stopped) = oneshot::channel::<()>();
        let (done, finished) = oneshot::channel();
        let router = router.clone();
        let app = app.clone();
        crate::spawn::thread(format!("loopwarden-serve-{}", i + 1), move || {
            let served = serve_thread(Incoming::Handed(handed), i + 1, app, router, stopped);
            let _ = done.send(served);
        })?;
        shutdown.push(stop);
        others.push(finished);
    }
    Ok(Running {
        addr,
        shutdown,
        server,
        others,
        app,
        replicas,
    })
}

/// On a database several replicas share: this one's halts, held requests and spend synced
/// with the others' (`crate::replicas`) while `app` lives. `None` on a database of its own.
async fn start_replicas(app: &Arc<App>) -> Option<crate::replicas::Replicas> {
    if !app.store.is_shared() {
        return None;
    }
    let replica = crate::replicas::replica_id();
    let pending = app.interventions.pending.clone();
    pending.share(app.store.clone(), replica.clone());
    let shared = crate::replicas::Shared {
        replica,
        store: app.store.clone(),
        ledger: app.ledger.clone(),
        controls: app.interventions.controls.clone(),
        pending,
    };
    let alive = Arc::downgrade(app);
    Some(crate::replicas::Replicas::start(shared, move || alive.strong_count() > 0).await)
}

/// Largest read buffer hyper keeps per client connection (its default is ~400 KiB), and so
/// the largest read a body arrives in. hyper grows a connection's buffer to the size of its
/// largest reads and never shrinks it, so every keep-alive connection holds what it once
/// needed for as long as it stays open, beside the body itself (which is read frame by
/// frame: `body::read_body`). Each read costs a wake-up and a comparison with the
/// conversation's last body (and then a copy into the body's own buffer): at 32 KiB a
/// 2 MB body took 60-odd of them, and the client's upload waited on the proxy (2 MB stream
/// at c4: time to first token nginx + 1.16 ms, at 64 KiB + 0.70). 128 KiB and more took peak
/// RSS at 64 × 209 KB over 64 MB then (BENCHMARKS.md, "What was tried"). Since a repeated body is
/// compared and no longer copied, 128 KiB gains nothing on the first token and still costs
/// 11 MB more at 64 × 209 KB (BENCHMARKS.md). The cap also bounds a request's header section:
/// 64 KiB, twice what nginx accepts by default.
const READ_BUFFER_MAX: usize = 64 * 1024;

/// How long the accepting loop waits after a failed accept (out of file descriptors: the
/// reaped connections free some meanwhile).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Where a serving thread's connections come from: thread 0 accepts them (and hands most
/// to the others, see [`spread`]); the others receive theirs.
enum Incoming {
    Listener(TcpListener),
    Handed(tokio::sync::mpsc::UnboundedReceiver<serve::Handed>),
}

impl Incoming {
    /// The next connection this thread serves, and on what terms; `None` once no more can
    /// come.
    async fn next(
        &mut self,
        me: usize,
        app: &App,
    ) -> Option<(tokio::net::TcpStream, SocketAddr, Admission)> {
        let spread = &app.spread;
        loop {
            match self {
                Incoming::Listener(listener) => match listener.accept().await {
                    Ok((stream, peer)) => {
                        // Streamed events are small writes; Nagle's algorithm would hold them back.
                        let _ = stream.set_nodelay(true);
                        match app.connections.admit(spread.total()) {
                            Admission::Refused => app.connections.refuse(stream),
                            // Beyond the cap: served here, and counted by `connections`
                            // alone (it holds no place under the cap).
                            Admission::OwnPathsOnly => {
                                return Some((stream, peer, Admission::OwnPathsOnly))
                            }
                            Admission::Served => {
                                if let Some(stream) = spread.place(stream, peer) {
                                    return Some((stream, peer, Admission::Served));
                                }
                            }
                        }
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: the connection stays in the
                        // backlog; wait (serving the others meanwhile) rather than spin.
                        crate::warn_per_request!(error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                Incoming::Handed(handed) => {
                    let handed = handed.recv().await?;
                    match tokio::net::TcpStream::from_std(handed.stream) {
                        Ok(stream) => return Some((stream, handed.peer, Admission::Served)),
                        Err(e) => {
                            // The thread that placed it here counted it as open.
                            spread.closed(me);
                            tracing::warn!(error = %e, "cannot serve a handed connection");
                        }
                    }
                }
            }
        }
    }
}

/// Serves `router` on the connections `incoming` yields to serving thread `me` until `stop`
/// fires (or its sender is dropped), then lets the connections in flight finish. (What
/// `axum::serve` does, with hyper's connection settings in reach: [`READ_BUFFER_MAX`].)
async fn serve(
    mut incoming: Incoming,
    me: usize,
    app: Arc<App>,
    router: Router,
    stop: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    // HTTP/1.1 only. The agents speak HTTP/1.1 to a plain-http base URL, and no client
    // speaks HTTP/2 without TLS (prior knowledge) to it; spoken, it would be a second
    // protocol to harden (its own header and stream limits) that nobody uses.
    // hyper's own HTTP/1.1 server: hyper-util's version-sniffing one would speak HTTP/2 too
    // once upgrades are on, whatever it is told.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.max_buf_size(READ_BUFFER_MAX);
    // Stopping: each connection finishes its request in flight and closes; `open` ends
    // (every task's sender dropped) once all have.
    let (stopping, _) = tokio::sync::watch::channel(false);
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let mut stop = std::pin::pin!(stop);
    loop {
        let (stream, peer, admission) = tokio::select! {
            next = incoming.next(me, &app) => match next {
                Some(connection) => connection,
                None => break,
            },
            _ = &mut stop => break,
        };
        let router = router.clone();
        let shared = app.clone();
        let (io, watch) = app.connections.open(stream, admission);
        let io = serve::wrap_tls(app.tls.as_ref(), io);
        let watching = watch.clone();
        let place = Arc::new(Place::new(app.clone(), watch.clone(), me));
        let upgradable = forward::Upgradable {
            watch,
            stop: stopping.subscribe(),
            cut: app.cut.clone(),
            open: open.clone(),
            place: place.clone(),
        };
        let service =
            hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
                // Until its response body ends, the connection is not waiting for a request.
                let serving = serve::Serving::begin(&watching);
                // A request that arrives while the proxy stops gets an answer that closes
                // the connection ([`close_when_stopping`]).
                let stopping = shared.stopping.load(std::sync::atomic::Ordering::Acquire);
                let served = move |mut response: Response| {
                    if stopping {
                        close_when_stopping(&mut response);
                    }
                    response.map(|body| serving.until_sent(body))
                };
                let own = operator::answered_here(request.uri().path());
                if watching.own_paths_only && !own {
                    let refused = shared.connections.refuse_request();
                    return Either::Left(Either::Right(std::future::ready(Ok(served(refused)))));
                }
                let upgrade = serve::route::asks_websocket(request.method(), request.headers());
                if upgrade {
                    // The socket outlives the 101's body and the connection's own future.
                    request.extensions_mut().insert(upgradable.clone());
                }
                if own {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    Either::Left(Either::Left(
                        router.clone().oneshot(request).map(|r| r.map(served)),
                    ))
                } else if upgrade && shared.config.server.websocket == WebSocketMode::Proxy {
                    let request = request.map(axum::body::Body::new);
                    let open = Box::pin(forward::open_websocket(shared.clone(), request));
                    Either::Right(Either::Right(open.map(|r| Ok(served(r)))))
                } else {
                    let request = request.map(axum::body::Body::new);
                    Either::Right(Either::Left(
                        forward::handle(State(shared.clone()), request).map(|r| Ok(served(r))),
                    ))
                }
            });
        // With upgrades: Codex's Responses WebSocket ([`websocket`]).
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        let mut stop = stopping.subscribe();
        let open = open.clone();
        let cut = app.cut.clone();
        crate::spawn::task("client connection", async move {
            // The connection is dropped at the end of this block, and with it what it was
            // still serving (logged then), before the server can count it closed.
            let ended = {
                let mut connection = std::pin::pin!(connection);
                tokio::select! {
                    ended = connection.as_mut() => Some(ended),
                    // It only ever changes to `true` (or goes, with the server).
                    _ = stop.changed() => {
                        connection.as_mut().graceful_shutdown();
                        tokio::select! {
                            ended = connection.as_mut() => Some(ended),
                            () = cut.done() => None,
                        }
                    }
                }
            };
            drop(open);
            match ended {
                Some(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
                None => tracing::debug!(%peer, "connection cut at the end of the shutdown grace"),
                Some(Ok(())) => {}
            }
            // Its place is freed now, or by the socket it was upgraded to when that ends.
            drop(place);
        });
    }
    drop(incoming);
    let _ = stopping.send(true);
    drop(open);
    let _ = all_closed.recv().await;
    Ok(())
}

/// An answer given while the proxy stops (draining) closes its connection: the client's
/// next request opens a new one, which the load balancer sends to another replica. An
/// upgrade's 101 is left alone (its socket closes when the stop reaches it).
fn close_when_stopping(response: &mut Response) {
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// One more serving thread: an event loop of its own (a current-thread runtime) serving the
/// connections handed to it with its own upstream pool, so that a request is read, forwarded
/// and answered on one thread, as nginx's workers do. Every thread shares the same [`App`].
/// A multi-threaded runtime would hand each request between threads several times
/// (connection task, upstream connection task, wake-ups of the idle worker), and at small
/// request sizes those context switches cost more than the request's own work.
fn serve_thread(
    incoming: Incoming,
    me: usize,
    app: Arc<App>,
    router: Router,
    stop: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    upstream::use_thread_client(upstream::Client::new(&app.config.upstream));
    runtime.block_on(serve(incoming, me, app, router, stop))
}

/// `server.public_url`, or `http(s)://` and the address the proxy listens on (a wildcard
/// address read as this machine's loopback): where the links in alerts point.
fn public_url(config: &Config, addr: SocketAddr) -> String {
    let scheme = scheme(config);
    match config.server.public_url.trim_end_matches('/') {
        "" if addr.ip().is_unspecified() => format!("{scheme}://localhost:{}", addr.port()),
        "" => format!("{scheme}://{addr}"),
        url => url.to_string(),
    }
}

/// The listener's scheme: `https` with `server.tls_cert` set.
fn scheme(config: &Config) -> &'static str {
    match config.server.tls_cert.is_empty() {
        true => "http",
        false => "https",
    }
}

/// Posts each alert to its policy's webhooks (`crate::intervene::alerts`), off the request
/// path, each delivery counted in `/metrics`.
fn alert_sink(
    client: upstream::Client,
    public_url: String,
    metrics: Arc<crate::metrics::Metrics>,
) -> crate::intervene::alerts::AlertSink {
    Arc::new(move |config, alert| {
        let body = alert.body(config.format, &public_url);
        let metrics = metrics.clone();
        let event = alert.event.as_str();
        upstream::post_all(
            &upstream::thread_client(&client),
            &config.webhooks,
            &body,
            Duration::from_millis(config.timeout_ms),
            "alert webhook",
            move |delivered| metrics.alert(event, delivered),
        );
    })
}

/// Drops idle cache entries now and then; ends with the proxy.
fn spawn_sweeper(app: std::sync::Weak<App>, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    crate::spawn::task("cache sweep", async move {
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(app) = app.upgrade() else { return };
            app.analyser.memory.sweep();
            app.ledger.sweep(crate::store::now_ms());
        }
    });
}

/// Entry point of `loopwarden serve`; its exit status ([`Stopped::exit_code`]).
pub fn serve_main(args: ServeArgs) -> anyhow::Result<std::process::ExitCode> {
    let config = args.load_config()?;
    use std::io::IsTerminal;
    crate::process_log::init(colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    ));
    if let Some(files) = serve::raise_open_file_limit() {
        tracing::debug!(files, "open-file limit");
    }
    if !serve::keep_large_blocks() {
        tracing::debug!("allocator settings left to the environment");
    }
    // The main thread is one of the serving threads (see `serve_thread` for why each has a
    // single-threaded event loop).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = start(config).await?;
        // Listened for before the proxy says it listens: a supervisor (or a test) may stop
        // it as soon as it reads that line, and a signal that came first would kill it
        // without writing out the log.
        let mut signals = Signals::listen()?;
        // The one line a user (or a script) needs: where to point the agents.
        println!("loopwarden listening on {}", running.url());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        while signals.next().await == Signal::Reload {
            // Reading and checking a config file is quick; requests meanwhile go on
            // under the policies in force.
            running.reload("signal");
        }
        tracing::info!(
            grace_secs = running.app.config.server.shutdown_grace_secs,
            "shutting down: finishing in-flight requests and writing the log"
        );
        let stopped = running.shutdown().await?;
        let log = stopped.log;
        match stopped.exit_code() {
            0 => tracing::info!("log written; bye"),
            EXIT_LOG_SPILLED => tracing::warn!(
                spilled = log.spilled,
                "log records spilled: the next start writes them; exit {EXIT_LOG_SPILLED}"
            ),
            code => tracing::error!(
                lost = log.lost,
                spilled = log.spilled,
                "log records lost at shutdown; exit {code}"
            ),
        }
        Ok(std::process::ExitCode::from(stopped.exit_code()))
    })
}

/// Whether log lines carry colour codes: only on a terminal, and not when `NO_COLOR` is
/// set to anything but the empty string (<https://no-color.org>). Piped into a file or a
/// log collector, escape codes are noise.
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// What a signal asks of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM or Ctrl-C: finish the requests in flight, write out the log, exit.
    Stop,
    /// SIGHUP: read the config file again (`crate::reload`).
    Reload,
}

/// The signals the proxy acts on, listened for from [`Signals::listen`] on (a signal
/// unlistened for would kill the process on the spot, the log not written out).
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
                hangup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => Signal::Stop,
            _ = self.interrupt.recv() => Signal::Stop,
            _ = self.hangup.recv() => Signal::Reload,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{colour, Stopped, EXIT_LOG_LOST, EXIT_LOG_SPILLED};
    use crate::store::Closed;

    #[test]
    fn the_exit_status_says_whether_the_log_was_written_spilled_or_lost() {
        let exit = |spilled, lost, unfinished| {
            Stopped {
                log: Closed {
                    spilled,
                    lost,
                    unfinished,
                },
            }
            .exit_code()
        };
        assert_eq!(exit(0, 0, false), 0);
        assert_eq!(exit(12, 0, false), EXIT_LOG_SPILLED);
        assert_eq!(
            exit(12, 1, false),
            EXIT_LOG_LOST,
            "a loss outweighs a spill"
        );
        assert_eq!(exit(0, 0, true), EXIT_LOG_LOST, "unaccounted for is lost");
    }

    #[test]
    fn colour_only_on_a_terminal_and_never_under_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "piped: no escape codes");
        assert!(!colour(true, Some("1".into())));
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
    }
}
