//! What every request shares ([`App`]: the configuration, the clients, the caches, the
//! log), and a client connection's place among the open ones ([`Place`]).

use std::sync::Arc;

use super::analysis::Analyser;
use crate::config::Config;
use crate::proxy::serve::{Connections, Cut, Spread, Watch};
use crate::proxy::upstream;
use crate::store::Store;

/// Everything a request handler shares.
pub struct App {
    pub config: Config,
    /// The upstream client of the thread that called `crate::proxy::start` (the others have their own:
    /// [`upstream::use_thread_client`]).
    pub client: upstream::Client,
    /// The message cache, each conversation's fold and last request.
    pub analyser: Analyser,
    /// The Responses answers relayed over HTTP, for requests that continue one by id.
    pub responses: Arc<upstream::ResponseChain>,
    /// The policies in force (each with its engine and intervention settings), swapped
    /// whole on a reload.
    pub policies: Arc<crate::reload::Live>,
    pub store: Store,
    /// Each conversation's spend, charged as answers end (`crate::budget::Ledger`).
    pub ledger: crate::budget::Ledger,
    /// Sticky halts, held requests and the intervention log (`crate::intervene`).
    pub interventions: crate::interventions::Interventions,
    /// Open client connections per serving thread, and where the next one goes.
    pub spread: Spread,
    /// Every open client connection's state, the limits that reap them, the cap.
    pub connections: Arc<Connections>,
    /// What `/metrics` exposes (`crate::proxy::operator`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where the OpenTelemetry spans go (`crate::telemetry`; nowhere unless configured).
    pub traces: Arc<crate::telemetry::Traces>,
    /// The end of a stop's grace period (`crate::proxy::Running::shutdown`).
    pub cut: Cut,
    /// Set when a stop begins: `/readyz` answers 503 and each answer closes its connection,
    /// while the listener still serves for `server.drain_secs`
    /// (`crate::proxy::Running::shutdown`).
    pub stopping: std::sync::atomic::AtomicBool,
    /// The listener's TLS (`server.tls_cert`); `None`: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// A client connection's place among the open ones (the cap's count, its serving thread's),
/// freed when the last holder lets go: its task, or the WebSocket it was upgraded to, which
/// outlives the task (`super::websocket::Upgradable`).
pub struct Place {
    app: Arc<App>,
    watch: Arc<Watch>,
    me: usize,
}

impl Place {
    /// The place of the connection `watch` follows, served by thread `me`.
    pub fn new(app: Arc<App>, watch: Arc<Watch>, me: usize) -> Place {
        Place { app, watch, me }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.app.connections.close(&self.watch);
        // A connection kept for the proxy's own paths at the cap was never counted in the
        // thread's spread.
        if !self.watch.own_paths_only {
            self.app.spread.closed(self.me);
        }
    }
}
