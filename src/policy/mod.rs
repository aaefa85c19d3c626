//! Named policies: who gets which guardrails. A team runs a CI fleet unattended and
//! developers interactively behind one proxy; each kind of traffic gets its own detection
//! thresholds, responses, budgets and logging, matched on what requests already carry
//! (`select`), with no change to the clients.
//!
//! Precedence, the one rule: the first `[[policy]]` in file order whose `match` holds
//! applies; when none does, the policy named `default` (or, without one, the global
//! tables). What a policy's settings are made of is `config`'s rule: defaults < global
//! tables < the inherited policy < the policy's own. The set in force is swapped whole on
//! a reload (`live`); a request keeps the policy it started under.

pub mod config;
pub mod key_id;
pub mod live;
pub mod select;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::budget::BudgetConfig;
use crate::config::{Config, ConfigError};
use crate::detect::{DetectConfig, Engine};
use crate::intervene::{InterveneConfig, Intervener};
use crate::store::LogConfig;
pub use select::{Client, Selector, Traffic};

/// How far a policy acts on what detection and budgets decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Act: remind, halt, hold, block, as the settings say.
    #[default]
    Enforce,
    /// Remind only: a stop becomes the stronger (replan) reminder and no response is
    /// blocked. For interactive sessions, where a person is there to stop the agent.
    NudgeOnly,
    /// Act on nothing: every byte passes both ways as if loopwarden were not there, and
    /// the log records what it would have done (`would_nudge`, `would_halt`, ...). For
    /// calibrating a policy on real traffic before enforcing it.
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::NudgeOnly => "nudge-only",
            Mode::Shadow => "shadow",
        }
    }
}

/// One policy, ready to serve: its settings and the engine built from them.
#[derive(Debug)]
pub struct Policy {
    pub name: Arc<str>,
    pub mode: Mode,
    pub selector: Selector,
    /// Detection under this policy's `[detect]` settings.
    pub engine: Engine,
    /// Interventions under this policy's `[intervene]` settings.
    pub intervener: Intervener,
    pub budget: BudgetConfig,
    pub log: LogConfig,
    /// Requests that fell under it since the proxy started (carried over reloads).
    matched: AtomicU64,
}

impl Policy {
    /// A policy named `default` with these detection settings and the defaults otherwise:
    /// what replays and benchmarks run the analysis under.
    pub fn detecting(detect: DetectConfig) -> Policy {
        Policy::new(config::Resolved {
            name: config::DEFAULT.into(),
            mode: Mode::Enforce,
            selector: Selector::default(),
            detect,
            intervene: InterveneConfig::default(),
            budget: BudgetConfig::default(),
            log: LogConfig::default(),
        })
    }

    fn new(r: config::Resolved) -> Policy {
        Policy {
            name: r.name.into(),
            mode: r.mode,
            selector: r.selector,
            engine: Engine::new(r.detect),
            intervener: Intervener::new(r.intervene),
            budget: r.budget,
            log: r.log,
            matched: AtomicU64::new(0),
        }
    }

    pub fn intervene(&self) -> &InterveneConfig {
        &self.intervener.config
    }

    pub fn detect(&self) -> &DetectConfig {
        &self.engine.config
    }

    pub fn matched(&self) -> u64 {
        self.matched.load(Ordering::Relaxed)
    }
}

/// The policies in force: the matchable ones in file order, and the default.
#[derive(Debug)]
pub struct PolicySet {
    ordered: Vec<Arc<Policy>>,
    default: Arc<Policy>,
    /// Some policy matches on key ids: only then is a request's key hashed.
    needs_key_id: bool,
}

impl PolicySet {
    /// The policies a configuration declares (its global tables as `default` when it
    /// declares none by that name).
    pub fn of(config: &Config) -> Result<PolicySet, ConfigError> {
        let sections = config::SectionTables::of(config).map_err(ConfigError::Policy)?;
        let resolved =
            config::resolve_all(&config.policies, &sections).map_err(ConfigError::Policy)?;
        for r in &resolved {
            r.selector.validate().map_err(|problem| {
                ConfigError::Policy(config::PolicyError {
                    policy: r.name.clone(),
                    problem,
                })
            })?;
        }
        let mut ordered = Vec::new();
        let mut default = None;
        for r in resolved {
            let policy = Arc::new(Policy::new(r));
            if &*policy.name == config::DEFAULT {
                default = Some(policy);
            } else {
                ordered.push(policy);
            }
        }
        let default = default.unwrap_or_else(|| Arc::new(Policy::detecting(config.detect.clone())));
        let needs_key_id = ordered.iter().any(|p| !p.selector.key_id.is_empty());
        Ok(PolicySet {
            ordered,
            default,
            needs_key_id,
        })
    }

    /// The policy a request falls under (counted as a match).
    pub fn select(&self, traffic: &Traffic<'_>) -> Arc<Policy> {
        let policy = self
            .ordered
            .iter()
            .find(|p| p.selector.matches(traffic))
            .unwrap_or(&self.default);
        policy.matched.fetch_add(1, Ordering::Relaxed);
        policy.clone()
    }

    pub fn needs_key_id(&self) -> bool {
        self.needs_key_id
    }

    /// Every policy, in the order they are tried, the default last.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.ordered.iter().chain(std::iter::once(&self.default))
    }

    pub fn named(&self, name: &str) -> Option<&Arc<Policy>> {
        self.iter().find(|p| &*p.name == name)
    }

    /// The policy of that name, else the default (where traffic it matched would go).
    pub fn named_or_default(&self, name: &str) -> &Arc<Policy> {
        self.named(name).unwrap_or(&self.default)
    }

    /// Carries the match counts of `before`'s policies over to the same names here.
    fn keep_counts(&self, before: &PolicySet) {
        for p in self.iter() {
            if let Some(old) = before.named(&p.name) {
                p.matched.store(old.matched(), Ordering::Relaxed);
            }
        }
    }
}
