//! The policies in force, swapped whole on a reload: on SIGHUP, and when the config file's
//! content changes (checked every second). A valid new file applies from the next request;
//! a request already under way keeps the policy it started with (it holds an `Arc` of it).
//! An invalid file changes nothing but the reported error. No request waits for a
//! reload: a request reads the set in force with one atomic load.
//!
//! Only what a policy holds is reloaded (`[detect]`, `[intervene]`, `[budget]`, `[log]`,
//! `[[policy]]`), and the price table (`[prices]`); the listener, the upstreams, the store, the caches and the admin token
//! need a restart, and a reload that changes them says so.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::config::Config;
use crate::policy::PolicySet;
use crate::store::now_ms;

/// How often the config file is read for changes.
pub const POLL: Duration = Duration::from_secs(1);

/// The policy set in force and how it got there.
pub struct Live {
    current: ArcSwap<PolicySet>,
    /// The configuration the proxy started with: what a reload cannot change.
    started: Config,
    /// The config file's text as last read (`None`: no file, or not read yet).
    seen: Mutex<Option<String>>,
    last: Mutex<Option<Reload>>,
    /// What else a valid new config applies (the price table).
    on_apply: Box<dyn Fn(&Config) + Send + Sync>,
    /// Reloads so far: applied, rejected (`/metrics`).
    counts: [std::sync::atomic::AtomicU64; 2],
}

/// What the last reload came to (`GET /admin/api/policies`).
#[derive(Debug, Clone, Serialize)]
pub struct Reload {
    pub at_ms: i64,
    /// What made it: `signal` (SIGHUP), `file` (its content changed) or `admin`.
    pub trigger: &'static str,
    pub outcome: Outcome,
    /// Why a new file was rejected, naming the key.
    pub error: Option<String>,
    /// Sections that changed but take a restart to apply.
    pub needs_restart: Vec<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The new policies are in force.
    Applied,
    /// The file was invalid: the policies in force are the ones before.
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Rejected => "rejected",
        }
    }
}

impl Live {
    pub fn new(
        set: PolicySet,
        started: Config,
        on_apply: Box<dyn Fn(&Config) + Send + Sync>,
    ) -> Live {
        set.warn_shadowed();
        let seen = started
            .source
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok());
        Live {
            current: ArcSwap::from_pointee(set),
            started,
            seen: Mutex::new(seen),
            last: Mutex::new(None),
            on_apply,
            counts: Default::default(),
        }
    }

    /// The policies in force.
    pub fn current(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// How many reloads were applied and rejected since the start.
    pub fn counts(&self) -> [(Outcome, u64); 2] {
        let n = |o: Outcome| self.counts[o as usize].load(std::sync::atomic::Ordering::Relaxed);
        [
            (Outcome::Applied, n(Outcome::Applied)),
            (Outcome::Rejected, n(Outcome::Rejected)),
        ]
    }

    /// The last reload, if any.
    pub fn last(&self) -> Option<Reload> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    /// Reloads when the file's content differs from what was last read. `None`: no
    /// change (or no file).
    pub fn reload_if_changed(&self) -> Option<Reload> {
        let path = self.started.source.as_ref()?;
        // Unreadable for now (being replaced, say): read again at the next poll.
        let text = std::fs::read_to_string(path).ok()?;
        if self.seen.lock().ok()?.as_deref() == Some(text.as_str()) {
            return None;
        }
        Some(self.reload("file"))
    }

    /// Reads the config file again (with the environment and the flags, as at start) and
    /// swaps in its policies when it is valid.
    pub fn reload(&self, trigger: &'static str) -> Reload {
        let Some(path) = self.started.source.clone() else {
            return self.report(
                trigger,
                Err("the proxy was started without a config file".into()),
            );
        };
        if let (Ok(text), Ok(mut seen)) = (std::fs::read_to_string(&path), self.seen.lock()) {
            *seen = Some(text);
        }
        let flags = self.started.flags.clone();
        let loaded = Config::load(Some(&path), |var| std::env::var(var).ok())
            .and_then(|config| config.with_flags(flags.listen, flags.db))
            .map_err(|e| e.to_string())
            .and_then(|config| {
                let set = config.policy_set().map_err(|e| e.to_string())?;
                Ok((config, set))
            });
        match loaded {
            Ok((config, set)) => {
                set.warn_shadowed();
                set.keep_counts(&self.current());
                self.current.store(Arc::new(set));
                (self.on_apply)(&config);
                let needs_restart = self.needs_restart(&config);
                self.report(trigger, Ok(needs_restart))
            }
            Err(e) => self.report(trigger, Err(e)),
        }
    }

    fn report(&self, trigger: &'static str, result: Result<Vec<&'static str>, String>) -> Reload {
        let reload = match result {
            Ok(needs_restart) => {
                tracing::info!(
                    trigger,
                    ?needs_restart,
                    "config reloaded: new policies in force"
                );
                Reload {
                    at_ms: now_ms(),
                    trigger,
                    outcome: Outcome::Applied,
                    error: None,
                    needs_restart,
                }
            }
            Err(error) => {
                tracing::error!(trigger, %error, "config reload rejected: the policies in force stay");
                Reload {
                    at_ms: now_ms(),
                    trigger,
                    outcome: Outcome::Rejected,
                    error: Some(error),
                    needs_restart: Vec::new(),
                }
            }
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some(reload.clone());
        }
        self.counts[reload.outcome as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        reload
    }

    /// The sections `config` changes that only a restart applies.
    fn needs_restart(&self, config: &Config) -> Vec<&'static str> {
        let s = &self.started;
        [
            ("server", s.server != config.server),
            ("upstream", s.upstream != config.upstream),
            ("store", s.store != config.store),
            ("admin", s.admin != config.admin),
            ("metrics", s.metrics != config.metrics),
            ("cache", s.cache != config.cache),
            ("telemetry", s.telemetry != config.telemetry),
        ]
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(name, _)| name)
        .collect()
    }
}

/// Reloads when the config file changes, until `live` is gone.
pub fn watch(live: std::sync::Weak<Live>) {
    crate::spawn::task("config watch", async move {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(live) = live.upgrade() else { return };
            // File reads off the event loop: a slow disk must not hold requests up.
            let _ = tokio::task::spawn_blocking(move || live.reload_if_changed()).await;
        }
    });
}
