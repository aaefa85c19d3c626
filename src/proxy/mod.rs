//! The HTTP side: routing, forwarding, the streaming tee, conversation identity, admin API.
//!
//! A request's journey: [`route`] picks the upstream and wire format → [`forward::handle`]
//! reads the body once → the dialect parses the history (through [`cache`], so only new
//! messages are parsed) → [`identity`] names the conversation → the detection engine
//! decides → [`intervention::plan`] turns the decision into forward / forward-modified /
//! answer → the original bytes go upstream → the answer streams back through [`tee`] →
//! [`record`] logs it to the [`crate::store`] off the request path.

pub mod admin;
pub mod cache;
pub mod conversations;
pub mod errors;
pub mod forward;
pub mod identity;
pub mod intervention;
pub mod record;
pub mod route;
pub mod tee;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{any, get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::detect::Engine;
use crate::store::{Store, StoreOptions};

/// Options of `loopwarden serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Config file (TOML). Defaults are built in; see config/loopwarden.toml.
    #[arg(long, env = "LOOPWARDEN_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides the config and LOOPWARDEN_LISTEN).
    #[arg(long)]
    pub listen: Option<String>,
    /// Database URL, e.g. sqlite://loopwarden.db (overrides the config and LOOPWARDEN_DB).
    #[arg(long)]
    pub db: Option<String>,
}

/// Everything a request handler shares.
pub struct App {
    pub config: Config,
    pub client: forward::UpstreamClient,
    pub engine: Engine,
    pub cache: cache::MessageCache,
    pub conversations: conversations::Conversations,
    pub store: Store,
    /// Sticky halts, held requests and the intervention log (`crate::intervene`).
    pub interventions: crate::intervene::service::Interventions,
}

/// A running proxy (in-process): its address, and a handle to stop it cleanly.
pub struct Running {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<std::io::Result<()>>,
    app: Arc<App>,
}

impl Running {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn store(&self) -> &Store {
        &self.app.store
    }

    /// Stops accepting, lets in-flight requests finish, then writes out the log.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.server).await??;
        self.app.store.flush().await;
        Ok(())
    }

    /// Waits for the log to hold everything finished so far (tests, admin snapshots).
    pub async fn flush_log(&self) {
        self.app.store.flush().await;
    }
}

/// Opens the log, binds the listener and serves until [`Running::shutdown`].
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let listen = config
        .listen_addr()
        .map_err(|e| anyhow::anyhow!("config key `server.listen`: {e}"))?;
    let store = Store::open(
        &config.store.db,
        StoreOptions {
            queue_capacity: config.store.queue_capacity,
            batch_size: config.store.batch_size,
            batch_window: StoreOptions::BATCH_WINDOW,
        },
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    let idle = Duration::from_secs(config.cache.idle_secs);
    let interventions = crate::intervene::service::Interventions::open(
        config.intervene.clone(),
        &config.detect,
        store.clone(),
    )
    .await?;
    let app = Arc::new(App {
        interventions,
        client: forward::upstream_client(&config.upstream),
        engine: Engine::new(config.detect.clone()),
        cache: cache::MessageCache::new(config.cache.max_bytes, idle),
        conversations: conversations::Conversations::new(idle),
        store,
        config,
    });
    spawn_sweeper(Arc::downgrade(&app), idle);
    crate::store::redact::warm_up();

    let admin = Router::new()
        .route("/admin/api/conversations", get(admin::conversations))
        .route("/admin/api/conversations/{id}", get(admin::conversation))
        .route("/admin/api/stats", get(admin::stats))
        .route(
            "/admin/api/conversations/{id}/resume",
            post(admin::resume_conversation),
        )
        .route(
            "/admin/api/conversations/{id}/halt",
            post(admin::halt_conversation),
        )
        .route("/admin/api/pending", get(admin::pending))
        .route("/admin/api/pending/{id}", post(admin::decide_pending))
        // Nothing under /admin/ is ever forwarded upstream.
        .route("/admin/{*rest}", any(admin::not_found))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            admin::require_access,
        ));
    let router = Router::new()
        .route("/healthz", get(admin::healthz))
        .merge(admin)
        .fallback(forward::handle)
        .with_state(app.clone());
    let listener = listener.tap_io(|tcp| {
        // Streamed events are small writes; Nagle's algorithm would hold them back.
        let _ = tcp.set_nodelay(true);
    });
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = shutdown_rx.await;
        })
        .into_future(),
    );
    Ok(Running {
        addr,
        shutdown: Some(shutdown_tx),
        server,
        app,
    })
}

/// Drops idle cache entries now and then; ends with the proxy.
fn spawn_sweeper(app: std::sync::Weak<App>, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(app) = app.upgrade() else { return };
            app.cache.sweep();
            app.conversations.sweep();
        }
    });
}

/// Entry point of `loopwarden serve`.
pub fn serve_main(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), |var| std::env::var(var).ok())?
        .with_flags(args.listen, args.db)?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = start(config).await?;
        // The one line a user (or a script) needs: where to point the agents.
        println!("loopwarden listening on {}", running.url());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests and writing the log");
        running.shutdown().await?;
        tracing::info!("log written; bye");
        Ok(())
    })
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
