//! Named policies: who gets which guardrails. A team runs a CI fleet unattended and
//! developers interactively behind one proxy; each kind of traffic gets its own detection
//! thresholds, responses, budgets and logging, matched on what requests already carry
//! (`select`), with no change to the clients.
//!
//! Precedence, the one rule: the first `[[policy]]` in file order whose `match` holds
//! applies; when none does, the policy named `default` (or, without one, the global
//! tables). What a policy's settings are made of is `config`'s rule: defaults < global
//! tables < the inherited policy < the policy's own. The set in force is swapped whole on
//! a reload (`crate::reload`); a request keeps the policy it started under.
//!
//! The part resolves its `[[policy]]` tables over the global sections `crate::config`
//! hands it (`config::Sources`), knowing nothing else of the configuration; `crate::config`
//! assembles the whole and checks it by resolving them.

pub mod config;
pub mod key_id;
pub mod select;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::budget::BudgetConfig;
use crate::detect::{DetectConfig, Engine};
pub use crate::intervene::Mode;
use crate::intervene::{InterveneConfig, Intervener};
use crate::store::LogConfig;
pub use select::{Client, Logged, Selector, Traffic};

/// One policy, ready to serve: its settings and the engine built from them.
#[derive(Debug)]
pub struct Policy {
    pub name: Arc<str>,
    /// The name as every answer under the policy carries it (`x-loopwarden-policy`), made
    /// once; `None` when the name cannot be a header value.
    pub header: Option<http::HeaderValue>,
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
            header: http::HeaderValue::from_str(&r.name).ok(),
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
    /// declares none by that name); `crate::config::Config::policy_set` hands them over.
    pub fn of(config: &config::Sources<'_>) -> Result<PolicySet, config::PolicyError> {
        let sections = config::SectionTables::of(config)?;
        let resolved = config::resolve_all(config.policies, &sections)?;
        for r in &resolved {
            r.selector
                .validate()
                .map_err(|problem| config::PolicyError {
                    policy: r.name.clone(),
                    problem,
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

    /// Policies that can never apply because an earlier one matches every request they
    /// match: (the later policy, the earlier one). Said by `loopwarden policies` and
    /// logged when the policies are put in force.
    pub fn shadowed(&self) -> Vec<(&str, &str)> {
        let mut found = Vec::new();
        for (i, later) in self.ordered.iter().enumerate() {
            if let Some(earlier) = self.ordered[..i]
                .iter()
                .find(|e| e.selector.covers(&later.selector))
            {
                found.push((&*later.name, &*earlier.name));
            }
        }
        found
    }

    /// Logs each policy [`PolicySet::shadowed`] names, as it is put in force.
    pub fn warn_shadowed(&self) {
        for (policy, by) in self.shadowed() {
            tracing::warn!(
                policy,
                by,
                "policy never applies: an earlier policy matches every request it matches"
            );
        }
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

    /// The policy a logged conversation falls under (not counted as a match): the first
    /// whose selector holds for what the log kept of its traffic. A selector on what the
    /// log does not keep (the key, the `user-agent` itself) is taken to hold for the
    /// policy the conversation was logged under (`logged_policy`) only.
    pub fn select_logged(&self, logged: &Logged, logged_policy: &str) -> &Arc<Policy> {
        self.ordered
            .iter()
            .find(|p| {
                p.selector
                    .matches_logged(logged)
                    .unwrap_or(*p.name == *logged_policy)
            })
            .unwrap_or(&self.default)
    }

    /// Carries the match counts of `before`'s policies over to the same names here (a
    /// reload, `crate::reload`).
    pub fn keep_counts(&self, before: &PolicySet) {
        for p in self.iter() {
            if let Some(old) = before.named(&p.name) {
                p.matched.store(old.matched(), Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::detect::config::Response;

    #[test]
    fn a_logged_conversation_falls_under_the_policy_its_team_selects() {
        let config: Config = toml::from_str(
            r#"
[[policy]]
name = "trial"
match = { key_id = "3fa9c1d2e4b5" }
[[policy]]
name = "ci"
match = { team = "ci*", api = "anthropic" }
"#,
        )
        .unwrap();
        let set = config.policy_set().unwrap();
        let logged = |team: &str, api: &str| Logged {
            team: Some(team.into()),
            api: Some(api.into()),
            ..Logged::default()
        };
        let name = |logged: &Logged, was: &str| set.select_logged(logged, was).name.to_string();
        assert_eq!(name(&logged("ci-nightly", "anthropic"), "default"), "ci");
        assert_eq!(name(&logged("ci", "openai_chat"), "default"), "default");
        // The key is not in the log: the key's policy holds for what it was logged under.
        assert_eq!(name(&logged("ci", "anthropic"), "trial"), "trial");
        assert_eq!(name(&Logged::default(), "gone"), "default");
    }

    fn set(toml: &str) -> Result<PolicySet, String> {
        let config: Config = toml::from_str(toml).map_err(|e| e.to_string())?;
        config.policy_set().map_err(|e| e.to_string())
    }

    fn traffic(team: Option<&str>, user_agent: &str, model: Option<&str>) -> Traffic<'static> {
        let user_agent: &'static str = Box::leak(user_agent.to_string().into_boxed_str());
        Traffic {
            team: team.map(|t| std::borrow::Cow::Owned(t.to_string())),
            key_id: None,
            client: Client::of(user_agent),
            user_agent,
            model: model.map(|m| &*Box::leak(m.to_string().into_boxed_str())),
            api: Some(crate::dialect::Dialect::Anthropic),
        }
    }

    const TEAMS: &str = r#"
        [detect.thresholds]
        fail_loop_runs = 4

        [[policy]]
        name = "strict"
        [policy.detect.thresholds]
        read_loop_reads = 2
        [policy.budget]
        dollars = 5.0

        [[policy]]
        name = "ci"
        inherit = "strict"
        mode = "enforce"
        match = { team = "ci" }
        [policy.detect.patterns.fail_loop]
        response = "halt"

        [[policy]]
        name = "devs"
        mode = "nudge-only"
        match = { client = ["claude-code", "codex"] }

        [[policy]]
        name = "sonnet-ci"
        match = { team = "ci", model = "claude-sonnet-*" }

        [[policy]]
        name = "default"
        mode = "shadow"
    "#;

    #[test]
    fn settings_merge_defaults_global_inherited_own() {
        let set = set(TEAMS).unwrap();
        let ci = set.named("ci").unwrap();
        let t = &ci.detect().thresholds;
        // Global, inherited, default: each key from the strongest level that sets it.
        assert_eq!(t.fail_loop_runs, 4);
        assert_eq!(t.read_loop_reads, 2);
        assert_eq!(
            t.edit_revert_returns,
            DetectConfig::default().thresholds.edit_revert_returns
        );
        assert_eq!(ci.detect().policy("fail_loop").response, Response::Halt);
        assert_eq!(ci.budget.dollars, 5.0, "inherited");
        assert_eq!(ci.mode, Mode::Enforce);
        let devs = set.named("devs").unwrap();
        assert_eq!(devs.detect().thresholds.read_loop_reads, 3, "not inherited");
        assert_eq!(devs.detect().thresholds.fail_loop_runs, 4, "global");
        assert_eq!(set.named("default").unwrap().mode, Mode::Shadow);
    }

    #[test]
    fn the_first_match_in_file_order_wins_and_the_rest_falls_to_default() {
        let set = set(TEAMS).unwrap();
        let pick = |t: Traffic<'static>| set.select(&t).name.to_string();
        assert_eq!(pick(traffic(Some("ci"), "curl/8", None)), "ci");
        // Matches `sonnet-ci` too, but `ci` comes first.
        assert_eq!(
            pick(traffic(
                Some("ci"),
                "claude-cli/2.1",
                Some("claude-sonnet-4-5")
            )),
            "ci"
        );
        assert_eq!(
            pick(traffic(
                None,
                "claude-cli/2.1.330 (external, sdk-cli)",
                None
            )),
            "devs"
        );
        assert_eq!(
            pick(traffic(Some("web"), "codex_exec/0.169.0", None)),
            "devs"
        );
        assert_eq!(pick(traffic(Some("web"), "opencode/1.18", None)), "default");
        // `strict` has no match: a base only.
        assert_eq!(pick(traffic(None, "curl/8", None)), "default");
        assert_eq!(set.named("ci").unwrap().matched(), 2);
        assert_eq!(set.named("strict").unwrap().matched(), 0);
    }

    #[test]
    fn key_model_and_api_selectors() {
        let key = key_id::of("sk-team-b-0123");
        let set = set(&format!(
            r#"
            [[policy]]
            name = "team-b"
            match = {{ key_id = "{key}" }}
            [[policy]]
            name = "gemini-flash"
            match = {{ api = "gemini", model = "gemini-*-flash*" }}
            "#
        ))
        .unwrap();
        assert!(set.needs_key_id());
        let mut t = traffic(None, "x", None);
        t.key_id = Some(key.clone());
        assert_eq!(&*set.select(&t).name, "team-b");
        t.key_id = Some(key_id::of("sk-other"));
        assert_eq!(&*set.select(&t).name, "default");
        let mut t = traffic(None, "x", Some("gemini-2.5-flash"));
        assert_eq!(&*set.select(&t).name, "default", "the API is anthropic");
        t.api = Some(crate::dialect::Dialect::Gemini);
        assert_eq!(&*set.select(&t).name, "gemini-flash");
    }

    #[test]
    fn mistakes_are_errors_that_name_the_policy_and_the_key() {
        let cases = [
            (
                "[[policy]]\nname = \"a\"\nmatch = { team = \"x\" }\n[policy.detect.thresholds]\nread_loop_read = 2\n",
                &["\"a\"", "read_loop_read", "read_loop_reads"][..],
            ),
            (
                "[[policy]]\nname = \"a\"\nmatch = { team = \"x\" }\n[policy.detect.patterns.read-loop]\nresponse = \"off\"\n",
                &["\"a\"", "read-loop", "read_loop"],
            ),
            ("[[policy]]\nname = \"a\"\ninherit = \"b\"\n", &["inherit", "\"b\""]),
            (
                "[[policy]]\nname = \"a\"\ninherit = \"b\"\n[[policy]]\nname = \"b\"\ninherit = \"a\"\n",
                &["itself"],
            ),
            ("[[policy]]\nname = \"default\"\nmatch = { team = \"x\" }\n", &["default", "match"]),
            ("[[policy]]\nname = \"a\"\n[[policy]]\nname = \"a\"\n", &["two policies"]),
            ("[[policy]]\nname = \"a\"\nmatch = { client = \"cursor\" }\n", &["match.client", "claude-code"]),
            ("[[policy]]\nname = \"a\"\nmatch = { key_id = \"sk-live-123\" }\n", &["match.key_id"]),
            ("[[policy]]\nname = \"a\"\nmode = \"log-only\"\n", &["log-only", "shadow"]),
            ("[[policy]]\nname = \"a\"\nmatch = { teams = \"x\" }\n", &["teams"]),
            ("[[policy]]\nname = \"a\"\n[policy.budget]\nwarn_at = 2.0\n", &["budget.warn_at"]),
            ("[[policy]]\nname = \"a\"\nmatch = {}\n", &["\"a\"", "match = {}", "matches no request"]),
        ];
        for (toml, words) in cases {
            let e = set(toml).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{toml}\n=> {e}\n(missing {w})");
            }
        }
    }

    #[test]
    fn without_policies_the_global_tables_are_the_default() {
        let mut config = Config::default();
        config.detect.thresholds.fail_loop_runs = 7;
        config.intervene.block = false;
        let set = config.policy_set().unwrap();
        let names: Vec<&str> = set.iter().map(|p| &*p.name).collect();
        assert_eq!(names, ["default"]);
        let default = set.named("default").unwrap();
        assert_eq!(default.detect(), &config.detect);
        assert_eq!(default.intervene(), &config.intervene);
    }

    #[test]
    fn a_policy_an_earlier_one_covers_is_named_shadowed() {
        let set = set(r#"
            [[policy]]
            name = "ci"
            match = { team = "CI*" }

            [[policy]]
            name = "nightly"
            match = { team = "ci-nightly", model = "gpt-*" }

            [[policy]]
            name = "ci-claude"
            match = { team = "ci", client = "claude-code" }

            [[policy]]
            name = "mini"
            match = { model = "*-mini", api = "openai_chat" }

            [[policy]]
            name = "mini-anywhere"
            match = { model = "*-mini" }
        "#)
        .unwrap();
        assert_eq!(
            set.shadowed(),
            [("nightly", "ci"), ("ci-claude", "ci")],
            "`mini` narrows by API: `mini-anywhere` still applies to the other APIs"
        );
    }
}
