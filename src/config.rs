//! Configuration: built-in defaults, then the TOML file (`--config`), then `LOOPWARDEN_*`
//! environment variables, then command-line flags. `config/loopwarden.toml` documents every
//! key with its default; [`Config::default`] is the single source of those defaults.
//!
//! A bad value fails at start with an error that names the key, never later on a request.
//!
//! Each part below the proxy owns its settings type (`crate::detect`, `crate::intervene`,
//! `crate::budget`, `crate::store`, `crate::telemetry`, `crate::policy`'s tables); this
//! file assembles them, with the proxy's own sections, and checks them by calling each
//! part's own check. Nothing below imports it back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::detect::DetectConfig;

/// The whole configuration of `loopwarden serve`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub admin: AdminConfig,
    pub cache: CacheConfig,
    /// Detection settings; owned and documented by `crate::detect`.
    pub detect: DetectConfig,
    /// What interventions do and say; owned and documented by `crate::intervene`.
    pub intervene: crate::intervene::InterveneConfig,
    /// Caps per conversation; owned and documented by `crate::budget`.
    pub budget: crate::budget::BudgetConfig,
    /// US dollars per million tokens by model glob, tried before the built-in list prices
    /// (`crate::budget::Prices`).
    pub prices: crate::budget::Prices,
    /// What the log keeps beyond the metadata (`crate::store::LogConfig`).
    pub log: crate::store::LogConfig,
    /// OpenTelemetry traces (`crate::telemetry`); off by default.
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// Named policies, tried in file order (`crate::policy`).
    #[serde(rename = "policy")]
    pub policies: Vec<crate::policy::config::PolicyTable>,
    /// Who may read `/metrics` (`crate::proxy::operator::scrape`).
    pub metrics: MetricsConfig,
    /// The file this was loaded from: what a reload reads again (`crate::reload`).
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
    /// The `serve` flags applied over the file (a reload applies them again).
    #[serde(skip)]
    pub flags: Flags,
}

/// The `serve` flags that set a key (they win over the file and the environment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    pub listen: Option<String>,
    pub db: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on (`LOOPWARDEN_LISTEN`, `--listen`).
    pub listen: String,
    /// The proxy's URL as its users reach it, for the links in alerts. Empty: `http://` and
    /// the listen address.
    pub public_url: String,
    /// Largest request body the proxy reads; larger ones get a 413 in the API's error shape.
    pub max_body_bytes: usize,
    /// Serving threads, each with its own event loop and upstream pool; each new connection
    /// goes to the thread with the fewest open and stays there (`crate::proxy::serve::spread`).
    /// 0: one per CPU.
    pub threads: usize,
    /// Longest a request head may take to arrive whole, from its first byte (a client that
    /// sends half a head and stops is disconnected: `crate::proxy::serve::connection`).
    pub header_timeout_secs: u64,
    /// Once a request head has arrived, its body must bring at least 1 KiB (or its end)
    /// within each period this long; a client that stops or trickles it is answered 408
    /// and disconnected (`crate::proxy::forward::body::with_idle_timeout`). nginx's
    /// `client_body_timeout` is 60 s too.
    pub body_timeout_secs: u64,
    /// A connection carrying no request (before its first, between two) is closed after
    /// this long; longer than the idle pools of the common HTTP clients (90 s), so that the
    /// client is the one that closes it.
    pub idle_timeout_secs: u64,
    /// Client connections open at most; over it, a connection waiting for a request is
    /// closed to make room, or, none waiting, the new one is answered 503 with
    /// `Retry-After`. 0: half the open-file limit (each connection may hold an upstream one
    /// as well), less a reserve.
    pub max_connections: usize,
    /// What a WebSocket upgrade gets (Codex opens the Responses API over one: README,
    /// "Codex's WebSocket transport").
    pub websocket: WebSocketMode,
    /// Longest a stop (SIGTERM, Ctrl-C) takes (`LOOPWARDEN_SHUTDOWN_GRACE_SECS`): held
    /// requests are answered at once, requests and streams in flight may finish within it
    /// and are cut near its end (its last quarter, 5 s at most, is the log's), and the log
    /// gets what is left (then what it could not write goes to the spill file). Under the
    /// common supervisors' stop timeouts (30 s).
    pub shutdown_grace_secs: u64,
    /// The first part of a stop's grace during which the proxy still serves everything,
    /// new connections included, while `/readyz` answers 503 (and each answer closes its
    /// connection): a load balancer that polls it (a Kubernetes readiness probe) stops
    /// sending new requests before the listener closes. At most half the grace; 0: the
    /// listener closes at once.
    pub drain_secs: u64,
    /// A WebSocket with no frame either way for this long, and no answer on its way, is
    /// closed (1001) and its place freed (`crate::proxy::websocket`).
    pub websocket_idle_secs: u64,
    /// A PEM file of the listener's certificate chain (leaf first): set with `tls_key`, the
    /// proxy serves HTTPS instead of plain HTTP (`crate::proxy::serve::listener_tls`, which
    /// [`ServerConfig::tls_acceptor`] builds).
    pub tls_cert: String,
    /// The PEM file of that certificate's private key.
    pub tls_key: String,
}

const TLS_BOTH_OR_NEITHER: &str =
    "server.tls_cert and server.tls_key are set together (both for TLS, neither for plain HTTP)";

impl ServerConfig {
    /// The listener's TLS settings when `server.tls_cert` and `server.tls_key` are both set;
    /// `Ok(None)` when neither is. An error names the key at fault and what is wrong.
    pub fn tls_acceptor(
        &self,
    ) -> Result<Option<tokio_rustls::TlsAcceptor>, (&'static str, String)> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (cert, key) = match (self.tls_cert.as_str(), self.tls_key.as_str()) {
            ("", "") => return Ok(None),
            (_, "") => return Err(("server.tls_key", TLS_BOTH_OR_NEITHER.into())),
            ("", _) => return Err(("server.tls_cert", TLS_BOTH_OR_NEITHER.into())),
            (cert, key) => (cert, key),
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| ("server.tls_cert", format!("cannot read {cert}: {e}")))?
            .collect::<Result<_, _>>()
            .map_err(|e| {
                (
                    "server.tls_cert",
                    format!("{cert} is not PEM certificates: {e}"),
                )
            })?;
        if chain.is_empty() {
            return Err(("server.tls_cert", format!("{cert} holds no certificate")));
        }
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            (
                "server.tls_key",
                format!("cannot read a PEM private key from {key}: {e}"),
            )
        })?;
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| {
                (
                    "server.tls_key",
                    format!("{key} does not go with {cert}: {e}"),
                )
            })?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            tls,
        ))))
    }
}

/// What the proxy does with a client's WebSocket upgrade (`server.websocket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebSocketMode {
    /// Proxied: the upstream is asked for the same upgrade, and the two sockets are joined
    /// with each turn read and ruled on as an HTTP request is (`crate::proxy::forward::websocket`).
    Proxy,
    /// Answered `426 Upgrade Required` at once: a client with an HTTP transport to fall
    /// back on (Codex) uses it without first retrying the socket.
    Refuse,
}

/// Where each API family is forwarded. Only these bases are ever contacted: the request
/// never chooses a host, so the proxy is not an open relay.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    pub openai: String,
    pub anthropic: String,
    pub gemini: String,
    /// TCP (and TLS) connect timeout; an upstream that cannot be reached gets a 502.
    pub connect_timeout_ms: u64,
    /// Longest wait for the upstream's response headers; then the client gets a 504.
    /// Long because a non-streamed answer only sends headers once it is complete.
    pub response_timeout_secs: u64,
    /// Idle pooled upstream connections are closed after this long.
    pub pool_idle_timeout_secs: u64,
    /// A response body from which no byte has arrived for this long is cut, and the client
    /// sees it break as it would if the upstream had broken it. As long as
    /// `response_timeout_secs`: a model may think silently as long inside a stream as
    /// before a non-streamed answer's head (README, "Configuration").
    pub stream_idle_secs: u64,
    /// A PEM file of CA certificates trusted beside the built-in roots, for an upstream
    /// (a gateway, a TLS-inspecting company proxy) whose certificate a private CA signed.
    /// Empty: the built-in roots only.
    pub ca_file: String,
    /// The HTTP proxy upstream connections go through (`crate::egress`):
    /// `http://[user:password@]host:port`, or `none`. Empty: the environment's
    /// `https_proxy`/`HTTPS_PROXY` for https upstreams, `http_proxy`/`HTTP_PROXY` for
    /// http ones.
    pub proxy: String,
    /// Upstream hosts reached without the proxy, as `NO_PROXY` lists them (domains, IP
    /// addresses, CIDR ranges, `*`, each with an optional `:port`). Empty: the
    /// environment's `no_proxy`/`NO_PROXY`.
    pub no_proxy: String,
    /// Loopback upstreams (localhost, 127.0.0.0/8, ::1) go through the proxy too; by
    /// default they are always reached directly.
    pub proxy_loopback: bool,
    /// The proxy variables of the environment the config was loaded with.
    #[serde(skip)]
    pub proxy_env: crate::egress::ProxyEnv,
}

impl UpstreamConfig {
    /// The settings an upstream connection's route is decided from.
    pub fn egress(&self) -> crate::egress::Settings<'_> {
        crate::egress::Settings {
            proxy: &self.proxy,
            no_proxy: &self.no_proxy,
            proxy_loopback: self.proxy_loopback,
            env: &self.proxy_env,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Database URL (`LOOPWARDEN_DB`, `--db`). SQLite: `sqlite://path` (created if missing);
    /// PostgreSQL: `postgres://user:password@host:port/database` (an existing database,
    /// shared by several replicas: README "Running several replicas").
    pub db: String,
    /// Log entries (a finished request's rows, an intervention) waiting to be written; when
    /// full, new entries are dropped and counted, so a slow disk never delays a request.
    pub queue_capacity: usize,
    /// Entries written per transaction at most.
    pub batch_size: usize,
    /// Log records kept for another attempt while writes fail for a while (the database
    /// locked by another process, the disk full); past this the oldest are dropped and
    /// counted (`crate::store::writer`).
    pub retry_rows: usize,
    /// Where the log records not written by the end of a shutdown go, to be written at the
    /// next start (JSON lines). Empty: beside a SQLite database (`PATH.spill.jsonl`), or
    /// `loopwarden.spill.jsonl` in the working directory for PostgreSQL.
    pub spill: String,
}

impl StoreConfig {
    /// The spill file's path ([`StoreConfig::spill`]).
    pub fn spill_path(&self) -> PathBuf {
        if !self.spill.is_empty() {
            return PathBuf::from(&self.spill);
        }
        let sqlite = self
            .db
            .strip_prefix("sqlite://")
            .or_else(|| self.db.strip_prefix("sqlite:"))
            .map(|rest| rest.split('?').next().unwrap_or(rest))
            .filter(|path| !path.is_empty() && *path != ":memory:");
        match sqlite {
            Some(path) => PathBuf::from(format!("{path}.spill.jsonl")),
            None => PathBuf::from("loopwarden.spill.jsonl"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token for `/admin/api/` (`LOOPWARDEN_ADMIN_TOKEN`). Empty: loopback clients that
    /// name this machine in `Host` only (`crate::proxy::operator::admin::check`).
    pub token: String,
    /// Tokens that read and act on one team's conversations only (`[[admin.team_tokens]]`),
    /// beside the global one (`crate::proxy::operator::admin::Access`).
    pub team_tokens: Vec<TeamToken>,
}

/// A team's admin token: its value is read from the environment variable `token_env` when
/// the config is loaded, so that no config file holds it.
#[derive(Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamToken {
    /// The team, as requests name it (`/t/{team}`, `x-loopwarden-team`; matched without case).
    pub team: String,
    /// The environment variable holding the token.
    pub token_env: String,
    /// The token, from `token_env`.
    #[serde(skip)]
    pub token: String,
}

impl std::fmt::Debug for TeamToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeamToken")
            .field("team", &self.team)
            .field("token_env", &self.token_env)
            .finish_non_exhaustive()
    }
}

impl AdminConfig {
    /// Each team token names a team and a set variable, and opens one door only: no two
    /// tokens are the same, and none is the global one. Teams are written as the log has
    /// them (`crate::policy::select::team_name`).
    fn check_team_tokens(&mut self) -> Result<(), String> {
        let mut seen: Vec<&str> = vec![self.token.as_str()];
        for entry in &mut self.team_tokens {
            let team = crate::policy::select::team_name(entry.team.trim().into()).into_owned();
            if team.is_empty() {
                return Err("each entry needs a team".into());
            }
            entry.team = team;
            let var = &entry.token_env;
            if var.is_empty() {
                return Err(format!(
                    "team {:?}: token_env names the environment variable holding its token",
                    entry.team
                ));
            }
            if entry.token.is_empty() {
                return Err(format!("team {:?}: {var} is not set", entry.team));
            }
            if entry.token.chars().any(|c| c.is_whitespace()) {
                return Err(format!(
                    "team {:?}: {var} must not contain whitespace",
                    entry.team
                ));
            }
            if seen.contains(&entry.token.as_str()) {
                return Err(format!(
                    "team {:?}: {var} holds a token already in use (the global one or another team's)",
                    entry.team
                ));
            }
            seen.push(&entry.token);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Bearer token for `/metrics` (`LOOPWARDEN_METRICS_TOKEN`), for a scraper that must not
    /// hold the admin token. Empty: the admin API's rules (`crate::proxy::operator::admin::check`).
    pub token: String,
}

/// What the proxy remembers between requests (see `proxy::memory`): every request resends
/// the whole history, so each message is parsed once and found again by its bytes, and each
/// conversation's last request, transcript and detection state are kept to read the next
/// one after.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Upper bound of the raw bytes of the messages held parsed.
    pub max_bytes: usize,
    /// Upper bound of the bytes held for conversations (each is charged twice its last
    /// body: the bytes and the transcript read from them); the least recently used go
    /// first.
    pub conversation_max_bytes: usize,
    /// A message no request has carried, or a conversation that sent nothing, for this
    /// long is dropped.
    pub idle_secs: u64,
    /// A conversation under a new id (or none) whose history continues from a summary is
    /// joined to the run whose summary request came from the same key and client at most
    /// this long before (`crate::proxy::memory::lineage`).
    pub compaction_link_secs: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            server: ServerConfig {
                listen: "127.0.0.1:8788".into(),
                public_url: String::new(),
                max_body_bytes: 64 * 1024 * 1024,
                threads: 0,
                header_timeout_secs: 30,
                body_timeout_secs: 60,
                idle_timeout_secs: 120,
                max_connections: 0,
                websocket: WebSocketMode::Proxy,
                shutdown_grace_secs: 20,
                drain_secs: 0,
                websocket_idle_secs: 300,
                tls_cert: String::new(),
                tls_key: String::new(),
            },
            upstream: UpstreamConfig {
                openai: "https://api.openai.com".into(),
                anthropic: "https://api.anthropic.com".into(),
                gemini: "https://generativelanguage.googleapis.com".into(),
                connect_timeout_ms: 10_000,
                response_timeout_secs: 600,
                pool_idle_timeout_secs: 90,
                stream_idle_secs: 600,
                ca_file: String::new(),
                proxy: String::new(),
                no_proxy: String::new(),
                proxy_loopback: false,
                proxy_env: Default::default(),
            },
            store: StoreConfig {
                db: "sqlite://loopwarden.db".into(),
                queue_capacity: 16_384,
                batch_size: 512,
                retry_rows: 65_536,
                spill: String::new(),
            },
            admin: AdminConfig::default(),
            cache: CacheConfig {
                max_bytes: 256 * 1024 * 1024,
                conversation_max_bytes: 256 * 1024 * 1024,
                idle_secs: 600,
                compaction_link_secs: 120,
            },
            detect: DetectConfig::default(),
            intervene: Default::default(),
            budget: Default::default(),
            prices: Default::default(),
            log: Default::default(),
            policies: Vec::new(),
            metrics: MetricsConfig::default(),
            telemetry: Default::default(),
            source: None,
            flags: Flags::default(),
        }
    }
}

macro_rules! section_defaults {
    ($($t:ident => $field:ident),*) => {$(
        impl Default for $t {
            fn default() -> $t {
                Config::default().$field
            }
        }
    )*};
}
section_defaults!(ServerConfig => server, UpstreamConfig => upstream, StoreConfig => store, CacheConfig => cache);

/// A configuration problem, naming the key (or file) at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config: {0}")]
    Policy(crate::policy::config::PolicyError),
    #[error("config key `{key}`{origin}: {problem}")]
    Invalid {
        key: &'static str,
        /// " (from LOOPWARDEN_X)" when an environment variable set it.
        origin: String,
        problem: String,
    },
}

/// Environment variables that override one key each.
const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("LOOPWARDEN_LISTEN", "server.listen"),
    ("LOOPWARDEN_DB", "store.db"),
    ("LOOPWARDEN_OPENAI_BASE_URL", "upstream.openai"),
    ("LOOPWARDEN_ANTHROPIC_BASE_URL", "upstream.anthropic"),
    ("LOOPWARDEN_GEMINI_BASE_URL", "upstream.gemini"),
    ("LOOPWARDEN_ADMIN_TOKEN", "admin.token"),
    ("LOOPWARDEN_METRICS_TOKEN", "metrics.token"),
    (
        "LOOPWARDEN_SHUTDOWN_GRACE_SECS",
        "server.shutdown_grace_secs",
    ),
];

/// What a command reads the configuration for: `serve` needs all of it; the commands that
/// read the file `serve` reads without serving (`replay`, `policies`) do not need the
/// secrets only a server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Serve,
    /// Without serving: a team token whose variable is unset is left out (it opens no door
    /// here) and named in [`Loaded::unset`] instead of failing the load.
    ReadOnly,
}

/// A configuration read without serving ([`Purpose::ReadOnly`]).
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// The secrets' variables that are not set: `serve` would refuse to start without
    /// them (`team "ci": LW_CI_TOKEN is not set`).
    pub unset: Vec<String>,
}

impl Config {
    /// Defaults, then `file`, then the environment as seen through `env` (a parameter so
    /// tests need not touch the process environment), for `serve`: every secret the file
    /// names must be set.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::load_for(file, env, Purpose::Serve).map(|loaded| loaded.config)
    }

    /// [`Config::load`] for `purpose`.
    pub fn load_for(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        purpose: Purpose,
    ) -> Result<Loaded, ConfigError> {
        // Set but empty is unset: the only way to lift a variable a container image sets.
        let env = |var: &str| env(var).filter(|value| !value.is_empty());
        let mut config = match file {
            Some(path) => Config {
                source: Some(path.to_path_buf()),
                ..Config::from_file(path)?
            },
            None => Config::default(),
        };
        for (var, key) in ENV_OVERRIDES {
            if let Some(value) = env(var) {
                config
                    .set(key, value)
                    .map_err(|problem| ConfigError::Invalid {
                        key,
                        origin: format!(" (from {var})"),
                        problem,
                    })?;
            }
        }
        config.upstream.proxy_env = crate::egress::ProxyEnv::read(env);
        for team in &mut config.admin.team_tokens {
            team.token = env(&team.token_env).unwrap_or_default();
        }
        let mut unset = Vec::new();
        if purpose == Purpose::ReadOnly {
            // An entry without a variable's name stays, for validation to say so.
            config.admin.team_tokens.retain(|t| {
                let missing = t.token.is_empty() && !t.token_env.trim().is_empty();
                if missing {
                    unset.push(format!("team {:?}: {} is not set", t.team, t.token_env));
                }
                !missing
            });
        }
        config.validate(|key| {
            ENV_OVERRIDES
                .iter()
                .find(|(var, k)| *k == key && env(var).is_some())
                .map(|(var, _)| format!(" (from {var})"))
                .unwrap_or_default()
        })?;
        Ok(Loaded { config, unset })
    }

    fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Sets a key by its dotted name (the keys of [`ENV_OVERRIDES`] and flags); an error
    /// says why the value is not one.
    fn set(&mut self, key: &str, value: String) -> Result<(), String> {
        match key {
            "server.shutdown_grace_secs" => {
                self.server.shutdown_grace_secs = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("{value:?} is not a number of seconds"))?
            }
            "server.listen" => self.server.listen = value,
            "store.db" => self.store.db = value,
            "upstream.openai" => self.upstream.openai = value,
            "upstream.anthropic" => self.upstream.anthropic = value,
            "upstream.gemini" => self.upstream.gemini = value,
            "admin.token" => self.admin.token = value,
            "metrics.token" => self.metrics.token = value,
            _ => {}
        }
        Ok(())
    }

    /// Applies `serve` flags (which win over file and environment) and re-validates.
    pub fn with_flags(
        mut self,
        listen: Option<String>,
        db: Option<String>,
    ) -> Result<Config, ConfigError> {
        self.flags = Flags {
            listen: listen.clone(),
            db: db.clone(),
        };
        let mut from_flag = Vec::new();
        if let Some(listen) = listen {
            self.set("server.listen", listen)
                .map_err(|problem| ConfigError::Invalid {
                    key: "server.listen",
                    origin: " (from --listen)".into(),
                    problem,
                })?;
            from_flag.push(("server.listen", " (from --listen)"));
        }
        if let Some(db) = db {
            self.set("store.db", db)
                .map_err(|problem| ConfigError::Invalid {
                    key: "store.db",
                    origin: " (from --db)".into(),
                    problem,
                })?;
            from_flag.push(("store.db", " (from --db)"));
        }
        self.validate(|key| {
            from_flag
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, o)| o.to_string())
                .unwrap_or_default()
        })?;
        Ok(self)
    }

    /// Checks every value and normalizes base URLs (no trailing slash).
    fn validate(&mut self, origin: impl Fn(&'static str) -> String) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, problem: String| ConfigError::Invalid {
            key,
            origin: origin(key),
            problem,
        };
        self.listen_addr()
            .map_err(|e| invalid("server.listen", e))?;
        self.server
            .tls_acceptor()
            .map_err(|(key, problem)| invalid(key, problem))?;
        for (key, url) in [
            ("upstream.openai", &mut self.upstream.openai),
            ("upstream.anthropic", &mut self.upstream.anthropic),
            ("upstream.gemini", &mut self.upstream.gemini),
        ] {
            *url = normalize_base_url(url).map_err(|e| invalid(key, e))?;
        }
        if !self.upstream.ca_file.is_empty() {
            extra_roots(&self.upstream.ca_file).map_err(|e| invalid("upstream.ca_file", e))?;
        }
        crate::egress::Egress::of(&self.upstream.egress()).map_err(|(var, problem)| {
            ConfigError::Invalid {
                key: "upstream.proxy",
                origin: var.map_or_else(|| origin("upstream.proxy"), |v| format!(" (from {v})")),
                problem,
            }
        })?;
        // A misspelt table would otherwise be ignored, and its pattern keep responding as
        // built in.
        crate::detect::registry::check_patterns(&self.detect)
            .map_err(|problem| invalid("detect.patterns", problem))?;
        if !self.store.db.starts_with("sqlite:") && !crate::store::postgres::is_url(&self.store.db)
        {
            return Err(invalid(
                "store.db",
                format!(
                    "{:?} is not a supported database URL (expected sqlite://PATH or postgres://USER@HOST/DATABASE)",
                    self.store.db
                ),
            ));
        }
        let positive: [(&'static str, u64); 16] = [
            (
                "server.websocket_idle_secs",
                self.server.websocket_idle_secs,
            ),
            (
                "intervene.pause.timeout_secs",
                self.intervene.pause.timeout_secs,
            ),
            (
                "intervene.pause.keepalive_secs",
                self.intervene.pause.keepalive_secs,
            ),
            ("server.max_body_bytes", self.server.max_body_bytes as u64),
            (
                "server.header_timeout_secs",
                self.server.header_timeout_secs,
            ),
            ("server.body_timeout_secs", self.server.body_timeout_secs),
            ("server.idle_timeout_secs", self.server.idle_timeout_secs),
            ("upstream.stream_idle_secs", self.upstream.stream_idle_secs),
            (
                "upstream.connect_timeout_ms",
                self.upstream.connect_timeout_ms,
            ),
            (
                "upstream.response_timeout_secs",
                self.upstream.response_timeout_secs,
            ),
            ("store.queue_capacity", self.store.queue_capacity as u64),
            ("store.batch_size", self.store.batch_size as u64),
            ("store.retry_rows", self.store.retry_rows as u64),
            ("cache.max_bytes", self.cache.max_bytes as u64),
            (
                "cache.conversation_max_bytes",
                self.cache.conversation_max_bytes as u64,
            ),
            ("cache.idle_secs", self.cache.idle_secs),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, "must be greater than 0".into()));
            }
        }
        let grace = self.server.shutdown_grace_secs;
        if self.server.drain_secs.saturating_mul(2) > grace {
            return Err(invalid(
                "server.drain_secs",
                format!(
                    "must be at most half of server.shutdown_grace_secs ({grace}): the drain \
                     is part of the grace, and the rest is for the requests in flight and the log"
                ),
            ));
        }
        if self.admin.token.chars().any(|c| c.is_whitespace()) {
            return Err(invalid("admin.token", "must not contain whitespace".into()));
        }
        self.admin
            .check_team_tokens()
            .map_err(|problem| invalid("admin.team_tokens", problem))?;
        if self.metrics.token.chars().any(|c| c.is_whitespace()) {
            return Err(invalid(
                "metrics.token",
                "must not contain whitespace".into(),
            ));
        }
        self.intervene
            .validate()
            .map_err(|(key, problem)| invalid(key, problem))?;
        self.budget
            .validate()
            .map_err(|(key, problem)| invalid(key, problem))?;
        // Every policy resolved and read, so that a mistake in one stops the start (or is
        // the reload's error) rather than surfacing on a request.
        self.policy_set()?;
        Ok(())
    }

    /// The policies this configuration declares, resolved (`crate::policy`): its
    /// `[[policy]]` tables over its global `[detect]`, `[intervene]`, `[budget]` and `[log]`.
    pub fn policy_set(&self) -> Result<crate::policy::PolicySet, ConfigError> {
        crate::policy::PolicySet::of(&crate::policy::config::Sources {
            policies: &self.policies,
            detect: &self.detect,
            intervene: &self.intervene,
            budget: &self.budget,
            log: &self.log,
        })
        .map_err(ConfigError::Policy)
    }

    /// `server.listen` as a socket address.
    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server.listen.parse().map_err(|_| {
            format!(
                "{:?} is not an address like 127.0.0.1:8788",
                self.server.listen
            )
        })
    }
}

/// The CA certificates of `upstream.ca_file` (PEM); an error saying what is wrong with the
/// file. Read when the config is checked, and again when each upstream client
/// (`crate::proxy::upstream`) is made: kept with the setting, below the proxy.
pub fn extra_roots(path: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{path} is not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path} holds no certificate"));
    }
    Ok(certs)
}

/// `http(s)://host[:port][/prefix]`, without a trailing slash, query or fragment.
fn normalize_base_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("{url:?} must start with http:// or https://")),
    }
    if uri.authority().is_none() {
        return Err(format!("{url:?} has no host"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!("{url:?} must not have a query or fragment"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_shipped_file_states_exactly_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/loopwarden.toml");
        let from_file = Config::load(Some(&path), no_env).expect("shipped config loads");
        assert_eq!(from_file.source.as_deref(), Some(path.as_path()));
        let from_file = Config {
            source: None,
            ..from_file
        };
        assert_eq!(from_file, Config::load(None, no_env).unwrap());
    }

    /// The `[detect]` section lists its defaults commented out: uncommented, they must
    /// still be exactly the defaults (so the documentation cannot drift from the code).
    #[test]
    fn the_commented_detect_defaults_are_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/loopwarden.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let start = text.find("\n[detect]\n").expect("a [detect] section");
        let end = text[start + 1..]
            .find("\n[intervene]")
            .map_or(text.len(), |i| start + 1 + i);
        let key_line = regex::Regex::new(r"^# ([a-z_]+ = .*|\[detect\.[a-z_]+\])$").unwrap();
        let uncommented: String = text[start..end]
            .lines()
            .filter_map(|l| key_line.captures(l).map(|c| c[1].to_string()))
            .map(|l| {
                // Drop a trailing comment (values hold no '#').
                let l = l.split("  #").next().unwrap_or(&l).trim_end().to_string();
                l + "\n"
            })
            .collect();
        assert!(uncommented.lines().count() > 30, "{uncommented}");
        let parsed: Config = toml::from_str(&format!("[detect]\n{uncommented}")).unwrap();
        assert_eq!(parsed.detect, DetectConfig::default());
    }

    #[test]
    fn the_shutdown_grace_comes_from_the_environment_and_a_bad_one_is_named() {
        let env = |value: &'static str| {
            move |var: &str| (var == "LOOPWARDEN_SHUTDOWN_GRACE_SECS").then(|| value.to_string())
        };
        let config = Config::load(None, env("7")).unwrap();
        assert_eq!(config.server.shutdown_grace_secs, 7);
        let e = Config::load(None, env("soon")).unwrap_err().to_string();
        assert!(e.contains("server.shutdown_grace_secs"), "{e}");
        assert!(e.contains("LOOPWARDEN_SHUTDOWN_GRACE_SECS"), "{e}");
    }

    #[test]
    fn the_drain_fits_in_half_the_shutdown_grace() {
        let dir = tempfile::tempdir().unwrap();
        let file = |toml: &str| {
            let path = dir.path().join("c.toml");
            std::fs::write(&path, toml).unwrap();
            Config::load(Some(&path), |_| None)
        };
        let config = file("[server]\nshutdown_grace_secs = 30\ndrain_secs = 15\n").unwrap();
        assert_eq!(config.server.drain_secs, 15);
        let e = file("[server]\nshutdown_grace_secs = 30\ndrain_secs = 16\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.drain_secs"), "{e}");
        assert!(e.contains("half of server.shutdown_grace_secs (30)"), "{e}");
    }

    #[test]
    fn the_spill_file_is_beside_a_sqlite_log_unless_configured() {
        let store = |db: &str, spill: &str| StoreConfig {
            db: db.into(),
            spill: spill.into(),
            ..Config::default().store
        };
        let path = |db, spill| store(db, spill).spill_path();
        assert_eq!(
            path("sqlite:///var/lib/lw/log.db?mode=rwc", ""),
            PathBuf::from("/var/lib/lw/log.db.spill.jsonl")
        );
        assert_eq!(
            path("postgres://u@h/db", ""),
            PathBuf::from("loopwarden.spill.jsonl")
        );
        assert_eq!(path("postgres://u@h/db", "/s/x"), PathBuf::from("/s/x"));
    }

    #[test]
    fn environment_overrides_the_file_and_flags_override_both() {
        let env = |var: &str| match var {
            "LOOPWARDEN_LISTEN" => Some("127.0.0.1:9999".to_string()),
            "LOOPWARDEN_OPENAI_BASE_URL" => Some("http://127.0.0.1:1234/".to_string()),
            "LOOPWARDEN_ADMIN_TOKEN" => Some("tok".to_string()),
            _ => None,
        };
        let c = Config::load(None, env).unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:9999");
        assert_eq!(c.upstream.openai, "http://127.0.0.1:1234");
        assert_eq!(c.admin.token, "tok");
        let c = c
            .with_flags(Some("127.0.0.1:1".into()), Some("sqlite://x.db".into()))
            .unwrap();
        // An empty variable leaves the key to the file (or the default).
        let env = |var: &str| (var == "LOOPWARDEN_LISTEN").then(String::new);
        assert_eq!(
            Config::load(None, env).unwrap().server.listen,
            Config::default().server.listen
        );
        assert_eq!(c.server.listen, "127.0.0.1:1");
        assert_eq!(c.store.db, "sqlite://x.db");
    }

    #[test]
    fn errors_name_the_key_and_where_the_value_came_from() {
        let env = |var: &str| (var == "LOOPWARDEN_GEMINI_BASE_URL").then(|| "ftp://x".into());
        let e = Config::load(None, env).unwrap_err().to_string();
        assert!(e.contains("upstream.gemini"), "{e}");
        assert!(e.contains("LOOPWARDEN_GEMINI_BASE_URL"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[store]\nbatch_size = 0\n").unwrap();
        let e = Config::load(Some(&path), no_env).unwrap_err().to_string();
        assert!(
            e.contains("store.batch_size") && e.contains("greater than 0"),
            "{e}"
        );

        // A detector's table under a name no detector has (the README used to spell them
        // with dashes) is an error naming the real ones, not a table silently ignored.
        std::fs::write(&path, "[detect.patterns.read-loop]\nresponse = \"off\"\n").unwrap();
        let e = Config::load(Some(&path), no_env).unwrap_err().to_string();
        assert!(
            e.contains("detect.patterns") && e.contains("\"read-loop\"") && e.contains("read_loop"),
            "{e}"
        );
        std::fs::write(&path, "[detect.patterns.read_loop]\nresponse = \"off\"\n").unwrap();
        assert!(Config::load(Some(&path), no_env).is_ok());

        std::fs::write(&path, "[server]\nlisten_on = \"x\"\n").unwrap();
        let e = Config::load(Some(&path), no_env).unwrap_err().to_string();
        assert!(e.contains("listen_on"), "{e}");

        std::fs::write(&path, "[upstream]\nopenai = 5\n").unwrap();
        let e = Config::load(Some(&path), no_env).unwrap_err().to_string();
        assert!(e.contains("openai"), "{e}");

        let e = Config::default()
            .with_flags(Some("nonsense".into()), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.listen") && e.contains("--listen"), "{e}");
    }

    #[test]
    fn the_database_is_sqlite_or_postgres() {
        for url in [
            "sqlite://x.db",
            "postgres://lw:secret@db:5432/loopwarden",
            "postgresql://db/loopwarden",
        ] {
            let env = |var: &str| (var == "LOOPWARDEN_DB").then(|| url.to_string());
            assert_eq!(Config::load(None, env).unwrap().store.db, url);
        }
        let env = |var: &str| (var == "LOOPWARDEN_DB").then(|| "mysql://db/x".to_string());
        let e = Config::load(None, env).unwrap_err().to_string();
        assert!(e.contains("store.db") && e.contains("postgres://"), "{e}");
    }
}
