//! What each conversation has spent so far, for its budget ([`Ledger::status`]) and the
//! admin API.
//!
//! The proxy charges an answer when its body ends (`crate::proxy::forward::tee`), before the client
//! can have it whole, so the conversation's next request sees it. Conversations idle for
//! [`Ledger::REMEMBER_MS`] are forgotten ([`Ledger::sweep`]); at start the ledger is filled
//! from the log's last [`Ledger::REMEMBER_MS`] ([`Ledger::restore`]), so a restart does not
//! give every conversation a fresh budget. A conversation idle longer than that starts
//! afresh.
//!
//! The ledger knows nothing of policies: it keeps the policy name each charge states.
//!
//! Several replicas on one PostgreSQL (issue 36): each charges its own answers here, and
//! `crate::replicas` publishes them and brings back the others' spend ([`Ledger::merge_others`]),
//! which every figure of the ledger adds to its own. A conversation's spend is then the sum
//! over the replicas that served it, as of the last sync.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;

use super::{BudgetConfig, Price, Prices, Usage};
use crate::store::{self, LoggedSpend, Store};

/// One conversation's spend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spend {
    /// The policy named by the conversation's last charge.
    pub policy: Arc<str>,
    /// Answers charged (complete answers the proxy could read).
    pub requests: u64,
    /// Of them, answers that stated no usage (an OpenAI Chat stream asked without
    /// `stream_options.include_usage`): their tokens are not counted.
    pub unreported: u64,
    /// Of them, answers of a model without a price: their tokens cost 0.
    pub unpriced: u64,
    /// Assistant turns of the conversation so far (its last answer's included).
    pub steps: u64,
    #[serde(flatten)]
    pub usage: Usage,
    pub dollars: f64,
    /// When the first charged request started, and when the last answer ended.
    pub first_ms: i64,
    pub last_ms: i64,
}

impl Spend {
    /// Every token counted, whatever its price.
    pub fn tokens(&self) -> u64 {
        self.usage.total()
    }

    /// The spend of one conversation on two replicas together: its policy is the one of
    /// the latest answer.
    fn plus(&self, other: &Spend) -> Spend {
        let mut usage = self.usage;
        usage.add(&other.usage);
        let latest = if other.last_ms > self.last_ms {
            other
        } else {
            self
        };
        Spend {
            policy: latest.policy.clone(),
            requests: self.requests + other.requests,
            unreported: self.unreported + other.unreported,
            unpriced: self.unpriced + other.unpriced,
            steps: self.steps.max(other.steps),
            usage,
            dollars: self.dollars + other.dollars,
            first_ms: self.first_ms.min(other.first_ms),
            last_ms: self.last_ms.max(other.last_ms),
        }
    }
}

/// One answer to charge.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    pub conversation: &'a str,
    pub policy: &'a str,
    /// The request's model; `None` (a body without one) is not priced.
    pub model: Option<&'a str>,
    /// `None`: the answer stated no usage.
    pub usage: Option<Usage>,
    /// Assistant turns in the request's history (the answer adds one).
    pub history_steps: u64,
    pub started_ms: i64,
    pub now_ms: i64,
}

/// The call a request is about to make, for [`Ledger::status_before`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NextCall<'a> {
    /// The request's model (`None`: not priced).
    pub model: Option<&'a str>,
    /// Its input tokens, estimated from its body ([`super::estimate::input_tokens`]).
    pub input_tokens: u64,
}

/// What an answer cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub dollars: f64,
    /// The model has a price (`false`: the answer cost 0 for want of one).
    pub priced: bool,
}

/// A budget's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cap {
    Steps,
    Tokens,
    Dollars,
    WallClock,
}

impl Cap {
    /// How a sentence names the budget: "the dollar budget".
    pub fn noun(self) -> &'static str {
        match self {
            Cap::Steps => "step",
            Cap::Tokens => "token",
            Cap::Dollars => "dollar",
            Cap::WallClock => "time",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Cap::Steps => "steps",
            Cap::Tokens => "tokens",
            Cap::Dollars => "dollars",
            Cap::WallClock => "wall_clock",
        }
    }

    /// An amount of this cap's unit for a human: `$4.12`, `1,204,000 tokens`, `12 steps`,
    /// `14m 05s`.
    pub fn show(self, amount: f64) -> String {
        match self {
            Cap::Dollars => format!("${amount:.2}"),
            Cap::Tokens => format!("{} tokens", thousands(amount as u64)),
            Cap::Steps => format!("{} steps", amount as u64),
            Cap::WallClock => duration(amount as u64),
        }
    }
}

/// Where a conversation stands against its budget. Of several caps, the most spent
/// (largest share) decides.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BudgetStatus {
    /// Below `warn_at` of every cap (or no cap set).
    Within,
    /// At or past `warn_at` of `cap`, below all of it: time to wrap up.
    Near {
        cap: Cap,
        share: f64,
        used: String,
        limit: String,
    },
    /// At or past all of `cap`.
    Spent {
        cap: Cap,
        used: String,
        limit: String,
    },
}

/// What a conversation has used of what a budget caps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Used {
    /// Steps its history holds.
    pub steps: u64,
    pub tokens: u64,
    pub dollars: f64,
    /// Since its first request.
    pub elapsed_secs: f64,
}

impl BudgetStatus {
    /// Where `used` stands against `budget`: the one reading of the caps, for the proxy's
    /// ledger and for `loopwarden replay --db`'s preview of a candidate's budget.
    pub fn of(budget: &BudgetConfig, used: &Used) -> BudgetStatus {
        status_of(
            [
                (Cap::Steps, used.steps as f64, budget.steps as f64),
                (Cap::Tokens, used.tokens as f64, budget.tokens as f64),
                (Cap::Dollars, used.dollars, budget.dollars),
                (
                    Cap::WallClock,
                    used.elapsed_secs,
                    budget.wall_clock_secs as f64,
                ),
            ],
            budget.warn_at,
        )
    }

    /// The status of a conversation a human let go on after a stop: a spent cap no longer
    /// stops it (that would answer every request with the halt again), it keeps reminding.
    pub fn lifted(self) -> BudgetStatus {
        match self {
            BudgetStatus::Spent { cap, used, limit } => BudgetStatus::Near {
                cap,
                share: 1.0,
                used,
                limit,
            },
            other => other,
        }
    }

    /// `$4.12 of $5.00` for a reminder or a halt; `None` when within.
    pub fn text(&self) -> Option<String> {
        match self {
            BudgetStatus::Within => None,
            BudgetStatus::Near { used, limit, .. } | BudgetStatus::Spent { used, limit, .. } => {
                Some(format!("{used} of {limit}"))
            }
        }
    }
}

/// Per-policy totals, for the admin API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySpend {
    pub policy: Arc<str>,
    pub conversations: u64,
    pub requests: u64,
    #[serde(flatten)]
    pub usage: Usage,
    pub dollars: f64,
}

/// The spend of every conversation seen lately. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

struct Inner {
    /// Swapped whole when the configuration is reloaded.
    prices: RwLock<Arc<Priced>>,
    conversations: Mutex<HashMap<String, Spend, foldhash::fast::RandomState>>,
    /// The other replicas' spend per conversation (sums over them), as last synced.
    others: Mutex<HashMap<String, Spend, foldhash::fast::RandomState>>,
    /// Models already reported unpriced in the process log (once each).
    unpriced_models: Mutex<std::collections::HashSet<String>>,
}

/// The prices in force and each model's price as resolved under them. A price is the first
/// of some fifty globs that matches the model's name, and a run names the same model on
/// every request: the walk is done once per model, not once per answer. Replaced with the
/// prices, so an entry never outlives the table it was resolved from.
struct Priced {
    prices: Prices,
    resolved: Mutex<HashMap<String, Option<Price>, foldhash::fast::RandomState>>,
}

impl Priced {
    /// Bounded like the unpriced set: a client naming a new model on every request must
    /// not grow it forever (past the bound, prices are resolved each time).
    const MAX_MODELS: usize = 1024;

    fn new(prices: Prices) -> Priced {
        Priced {
            prices,
            resolved: Mutex::default(),
        }
    }

    fn price(&self, model: &str) -> Option<Price> {
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(price) = resolved.get(model) {
            return *price;
        }
        let price = self.prices.price(model);
        if resolved.len() < Self::MAX_MODELS {
            resolved.insert(model.to_string(), price);
        }
        price
    }
}

impl Ledger {
    /// How long an idle conversation's spend is kept, and how far back [`Ledger::restore`]
    /// reads the log: a day, so a budget outlives a lunch break and a restart, while the
    /// ledger stays bounded by the day's conversations (~200 bytes each).
    pub const REMEMBER_MS: i64 = 24 * 3600 * 1000;

    pub fn new(prices: Prices) -> Ledger {
        Ledger {
            inner: Arc::new(Inner {
                prices: RwLock::new(Arc::new(Priced::new(prices))),
                conversations: Mutex::default(),
                others: Mutex::default(),
                unpriced_models: Mutex::default(),
            }),
        }
    }

    /// The prices from now on (a configuration reload); spend already charged stays.
    pub fn set_prices(&self, prices: Prices) {
        *self.inner.prices.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Priced::new(prices));
    }

    fn priced(&self) -> Arc<Priced> {
        self.inner
            .prices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Spend, foldhash::fast::RandomState>> {
        self.inner
            .conversations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one answer to its conversation's spend; returns what it cost.
    pub fn charge(&self, c: &Charge<'_>) -> Cost {
        let price = c.model.and_then(|m| self.priced().price(m));
        let dollars = match (price, &c.usage) {
            (Some(price), Some(usage)) => price.cost(usage),
            _ => 0.0,
        };
        if price.is_none() && c.usage.is_some() {
            self.report_unpriced(c.model.unwrap_or(""));
        }
        let cost = Cost {
            dollars,
            priced: price.is_some(),
        };
        let mut map = self.lock();
        // Looked up by the borrowed id first: only a conversation's first answer copies it.
        if !map.contains_key(c.conversation) {
            let first = Spend {
                policy: Arc::from(c.policy),
                requests: 0,
                unreported: 0,
                unpriced: 0,
                steps: 0,
                usage: Usage::default(),
                dollars: 0.0,
                first_ms: c.started_ms,
                last_ms: c.now_ms,
            };
            map.insert(c.conversation.to_string(), first);
        }
        let Some(spend) = map.get_mut(c.conversation) else {
            return cost; // inserted above, under the lock
        };
        if *spend.policy != *c.policy {
            spend.policy = Arc::from(c.policy);
        }
        spend.requests += 1;
        match &c.usage {
            Some(usage) => spend.usage.add(usage),
            None => spend.unreported += 1,
        }
        if price.is_none() && c.usage.is_some() {
            spend.unpriced += 1;
        }
        spend.steps = spend.steps.max(c.history_steps + 1);
        spend.dollars += dollars;
        spend.first_ms = spend.first_ms.min(c.started_ms);
        spend.last_ms = spend.last_ms.max(c.now_ms);
        cost
    }

    /// Says once per model, in the process log, that its answers cost 0.
    fn report_unpriced(&self, model: &str) {
        let mut seen = self
            .inner
            .unpriced_models
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Bounded: a client naming a new model on every request must not grow it forever.
        // Looked up before it is copied: an unpriced model is reported by every answer.
        if seen.len() < 1024 && !seen.contains(model) && seen.insert(model.to_string()) {
            tracing::warn!(
                model,
                priced = false,
                "no price for this model: its answers cost $0 (add it to [prices])"
            );
        }
    }

    fn others(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Spend, foldhash::fast::RandomState>> {
        self.inner.others.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One conversation's spend, if it has any (the other replicas' included).
    pub fn spend(&self, conversation: &str) -> Option<Spend> {
        let mine = self.lock().get(conversation).cloned();
        let others = self.others().get(conversation).cloned();
        match (mine, others) {
            (Some(mine), Some(others)) => Some(mine.plus(&others)),
            (mine, others) => mine.or(others),
        }
    }

    /// Every conversation's spend, the other replicas' included.
    fn all(&self) -> Vec<(String, Spend)> {
        let mut all: HashMap<String, Spend, foldhash::fast::RandomState> = self.lock().clone();
        for (id, theirs) in self.others().iter() {
            match all.get_mut(id) {
                Some(mine) => *mine = mine.plus(theirs),
                None => {
                    all.insert(id.clone(), theirs.clone());
                }
            }
        }
        all.into_iter().collect()
    }

    /// This replica's own spend of the conversations charged at `since_ms` or later, to
    /// publish (`crate::replicas`).
    pub fn charged_since(&self, since_ms: i64) -> Vec<LoggedSpend> {
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.lock()
            .iter()
            .filter(|(_, s)| s.last_ms >= since_ms)
            .map(|(id, s)| LoggedSpend {
                conversation_id: id.clone(),
                requests: count(s.requests),
                steps: s.steps.checked_sub(1).map(count),
                input_tokens: count(s.usage.input),
                cached_input_tokens: count(s.usage.cached_input),
                cache_write_tokens: count(s.usage.cache_write),
                output_tokens: count(s.usage.output),
                cost_usd: s.dollars,
                unpriced: count(s.unpriced),
                first_ms: s.first_ms,
                last_ms: s.last_ms,
                policy: Some(s.policy.to_string()),
            })
            .collect()
    }

    /// Takes in the other replicas' spend of some conversations (each row their sum over
    /// every other replica, replacing what was held of it).
    pub fn merge_others(&self, rows: impl IntoIterator<Item = LoggedSpend>) {
        let mut others = self.others();
        for row in rows {
            let (id, spend) = spend_of(row);
            others.insert(id, spend);
        }
    }

    /// Where `conversation` stands against `budget`: its `steps` (the caller's count, the
    /// transcript's), its tokens and dollars, and the time since its first request.
    pub fn status(
        &self,
        conversation: &str,
        steps: u64,
        budget: &BudgetConfig,
        now_ms: i64,
    ) -> BudgetStatus {
        self.status_before(conversation, steps, budget, now_ms, NextCall::default())
    }

    /// [`Ledger::status`] with the call about to be made counted in: its estimated input
    /// tokens, and their dollars at its model's input price. A call that would cross a cap
    /// finds it spent, before it is made.
    pub fn status_before(
        &self,
        conversation: &str,
        steps: u64,
        budget: &BudgetConfig,
        now_ms: i64,
        next: NextCall<'_>,
    ) -> BudgetStatus {
        let spend = self.spend(conversation);
        let mut used = match &spend {
            Some(s) => Used {
                steps,
                tokens: s.tokens(),
                dollars: s.dollars,
                elapsed_secs: (now_ms - s.first_ms).max(0) as f64 / 1000.0,
            },
            None => Used {
                steps,
                ..Used::default()
            },
        };
        if next.input_tokens > 0 {
            let price = next.model.and_then(|m| self.priced().price(m));
            used.tokens += next.input_tokens;
            used.dollars += price.map_or(0.0, |p| {
                p.cost(&Usage {
                    input: next.input_tokens,
                    ..Usage::default()
                })
            });
        }
        BudgetStatus::of(budget, &used)
    }

    /// Conversations, the most recently charged first, at most `limit`.
    pub fn conversations(&self, limit: usize) -> Vec<(String, Spend)> {
        let mut all = self.all();
        all.sort_by(|a, b| b.1.last_ms.cmp(&a.1.last_ms).then_with(|| a.0.cmp(&b.0)));
        all.truncate(limit);
        all
    }

    /// Totals per policy over every conversation held, by policy name.
    pub fn policies(&self) -> Vec<PolicySpend> {
        let mut by_policy: Vec<PolicySpend> = Vec::new();
        for (_, spend) in &self.all() {
            let total = match by_policy.iter_mut().find(|p| p.policy == spend.policy) {
                Some(total) => total,
                None => {
                    by_policy.push(PolicySpend {
                        policy: spend.policy.clone(),
                        conversations: 0,
                        requests: 0,
                        usage: Usage::default(),
                        dollars: 0.0,
                    });
                    let last = by_policy.len() - 1;
                    &mut by_policy[last]
                }
            };
            total.conversations += 1;
            total.requests += spend.requests;
            total.usage.add(&spend.usage);
            total.dollars += spend.dollars;
        }
        by_policy.sort_by(|a, b| a.policy.cmp(&b.policy));
        by_policy
    }

    /// Forgets the conversations charged nothing for [`Ledger::REMEMBER_MS`].
    pub fn sweep(&self, now_ms: i64) {
        self.lock()
            .retain(|_, s| now_ms - s.last_ms < Self::REMEMBER_MS);
        self.others()
            .retain(|_, s| now_ms - s.last_ms < Self::REMEMBER_MS);
    }

    /// Fills the ledger from the log's last [`Ledger::REMEMBER_MS`] (at start, before the
    /// first request). Returns the conversations restored.
    pub async fn restore_from(&self, store: &Store, now_ms: i64) -> Result<usize, store::Error> {
        let rows = store.recent_spend(now_ms - Self::REMEMBER_MS).await?;
        let n = rows.len();
        self.restore(rows);
        Ok(n)
    }

    /// Puts back spend read from the log (a conversation already charged since keeps its
    /// live figures), under the policy of its last request (rows written before policies
    /// existed count as `default`'s).
    pub fn restore(&self, rows: impl IntoIterator<Item = LoggedSpend>) {
        let mut map = self.lock();
        for row in rows {
            let (id, spend) = spend_of(row);
            map.entry(id).or_insert(spend);
        }
    }
}

/// Spend read from the database (the log's sums, or other replicas' published spend).
fn spend_of(row: LoggedSpend) -> (String, Spend) {
    let count = |n: i64| n.max(0) as u64;
    let spend = Spend {
        policy: row
            .policy
            .map_or_else(|| Arc::from(crate::names::DEFAULT_POLICY), Arc::from),
        requests: count(row.requests),
        unreported: 0,
        unpriced: count(row.unpriced),
        steps: row.steps.map_or(0, |s| count(s) + 1),
        usage: Usage {
            input: count(row.input_tokens),
            cached_input: count(row.cached_input_tokens),
            cache_write: count(row.cache_write_tokens),
            output: count(row.output_tokens),
        },
        dollars: row.cost_usd,
        first_ms: row.first_ms,
        last_ms: row.last_ms,
    };
    (row.conversation_id, spend)
}

/// The status the caps give: `(cap, used, limit)`, a limit of 0 being no cap.
fn status_of(caps: [(Cap, f64, f64); 4], warn_at: f64) -> BudgetStatus {
    let worst = caps
        .into_iter()
        .filter(|(_, _, limit)| *limit > 0.0)
        .map(|(cap, used, limit)| (cap, used, limit, used / limit))
        .fold(None, |worst: Option<(Cap, f64, f64, f64)>, c| match worst {
            Some(w) if w.3 >= c.3 => Some(w),
            _ => Some(c),
        });
    let Some((cap, used, limit, share)) = worst else {
        return BudgetStatus::Within;
    };
    let (used, limit) = (cap.show(used), cap.show(limit));
    if share >= 1.0 {
        BudgetStatus::Spent { cap, used, limit }
    } else if share >= warn_at {
        BudgetStatus::Near {
            cap,
            share,
            used,
            limit,
        }
    } else {
        BudgetStatus::Within
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as `45s`, `14m 05s` or `2h 03m`.
fn duration(secs: u64) -> String {
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m {:02}s", secs / 60, secs % 60),
        _ => format!("{}h {:02}m", secs / 3600, secs % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Price;

    const OPUS: &str = "claude-opus-5-5";

    fn ledger() -> Ledger {
        // $1 per million of every kind: a token costs a microdollar.
        let one = Price {
            input: 1.0,
            cached_input: 1.0,
            cache_write: 1.0,
            output: 1.0,
        };
        Ledger::new(Prices::new(vec![("m".into(), one)]))
    }

    fn charge(ledger: &Ledger, conversation: &str, tokens: u64, at: i64) -> Cost {
        ledger.charge(&Charge {
            conversation,
            policy: "default",
            model: Some("m"),
            usage: Some(Usage {
                input: tokens,
                ..Usage::default()
            }),
            history_steps: 0,
            started_ms: at,
            now_ms: at,
        })
    }

    fn budget(f: impl FnOnce(&mut BudgetConfig)) -> BudgetConfig {
        let mut b = BudgetConfig::default();
        f(&mut b);
        b
    }

    #[test]
    fn charges_add_up_per_conversation() {
        let ledger = ledger();
        assert_eq!(
            charge(&ledger, "a", 1_000_000, 10),
            Cost {
                dollars: 1.0,
                priced: true
            }
        );
        charge(&ledger, "a", 500_000, 20);
        charge(&ledger, "b", 7, 15);
        let a = ledger.spend("a").unwrap();
        assert_eq!(
            (a.requests, a.usage.input, a.first_ms, a.last_ms),
            (2, 1_500_000, 10, 20)
        );
        assert!((a.dollars - 1.5).abs() < 1e-12);
        assert_eq!(ledger.spend("b").unwrap().requests, 1);
        let ids: Vec<String> = ledger
            .conversations(10)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, ["a", "b"], "the most recently charged first");
        let totals = ledger.policies();
        assert_eq!(totals.len(), 1);
        assert_eq!((totals[0].conversations, totals[0].requests), (2, 3));
    }

    #[test]
    fn an_unpriced_model_costs_nothing_and_an_unreported_usage_counts_no_tokens() {
        let ledger = ledger();
        let cost = ledger.charge(&Charge {
            conversation: "a",
            policy: "ci",
            model: Some("mock-model"),
            usage: Some(Usage {
                output: 10,
                ..Usage::default()
            }),
            history_steps: 3,
            started_ms: 0,
            now_ms: 1,
        });
        assert_eq!(
            cost,
            Cost {
                dollars: 0.0,
                priced: false
            }
        );
        ledger.charge(&Charge {
            conversation: "a",
            policy: "ci",
            model: Some(OPUS),
            usage: None,
            history_steps: 4,
            started_ms: 2,
            now_ms: 3,
        });
        let a = ledger.spend("a").unwrap();
        assert_eq!(
            (a.requests, a.unpriced, a.unreported, a.tokens(), a.steps),
            (2, 1, 1, 10, 5)
        );
        assert_eq!(&*a.policy, "ci");
    }

    #[test]
    fn idle_conversations_are_forgotten_and_restored_ones_kept() {
        let ledger = ledger();
        charge(&ledger, "old", 1, 0);
        charge(&ledger, "new", 1, Ledger::REMEMBER_MS);
        ledger.sweep(Ledger::REMEMBER_MS);
        assert!(ledger.spend("old").is_none());
        assert!(ledger.spend("new").is_some());
        let logged = |id: &str| LoggedSpend {
            conversation_id: id.into(),
            requests: 99,
            steps: Some(7),
            input_tokens: 1,
            cached_input_tokens: 2,
            cache_write_tokens: 3,
            output_tokens: 4,
            cost_usd: 0.5,
            unpriced: 0,
            first_ms: 5,
            last_ms: 6,
            policy: None,
        };
        ledger.restore([logged("new"), logged("back")]);
        assert_eq!(ledger.spend("new").unwrap().requests, 1, "live figures win");
        let back = ledger.spend("back").unwrap();
        assert_eq!(
            (back.requests, back.steps, back.tokens(), back.dollars),
            (99, 8, 10, 0.5)
        );
        assert_eq!(&*back.policy, "default");
    }

    #[test]
    fn no_cap_and_no_spend_are_within() {
        let ledger = ledger();
        assert_eq!(
            ledger.status("x", 1000, &BudgetConfig::default(), 0),
            BudgetStatus::Within
        );
        let steps = budget(|b| b.steps = 10);
        assert_eq!(ledger.status("x", 7, &steps, 0), BudgetStatus::Within);
    }

    #[test]
    fn exactly_at_warn_at_is_near_and_exactly_at_the_cap_is_spent() {
        let ledger = ledger();
        charge(&ledger, "c", 4_000_000, 0); // $4.00
        let dollars = budget(|b| b.dollars = 5.0);
        let near = ledger.status("c", 0, &dollars, 0);
        assert_eq!(
            near,
            BudgetStatus::Near {
                cap: Cap::Dollars,
                share: 0.8,
                used: "$4.00".into(),
                limit: "$5.00".into()
            }
        );
        assert_eq!(near.text().as_deref(), Some("$4.00 of $5.00"));
        // Just under warn_at.
        let higher = budget(|b| {
            b.dollars = 5.0;
            b.warn_at = 0.81;
        });
        assert_eq!(ledger.status("c", 0, &higher, 0), BudgetStatus::Within);
        charge(&ledger, "c", 1_000_000, 0); // $5.00
        let spent = ledger.status("c", 0, &dollars, 0);
        assert_eq!(spent.text().as_deref(), Some("$5.00 of $5.00"));
        assert!(matches!(
            spent,
            BudgetStatus::Spent {
                cap: Cap::Dollars,
                ..
            }
        ));
        // Steps exactly at the cap, tokens exactly at it.
        let steps = budget(|b| b.steps = 40);
        assert!(matches!(
            ledger.status("c", 40, &steps, 0),
            BudgetStatus::Spent {
                cap: Cap::Steps,
                ..
            }
        ));
        assert!(matches!(
            ledger.status("c", 32, &steps, 0),
            BudgetStatus::Near {
                cap: Cap::Steps,
                ..
            }
        ));
        assert_eq!(ledger.status("c", 31, &steps, 0), BudgetStatus::Within);
        let tokens = budget(|b| b.tokens = 5_000_000);
        assert_eq!(
            ledger.status("c", 0, &tokens, 0).text().as_deref(),
            Some("5,000,000 tokens of 5,000,000 tokens")
        );
    }

    #[test]
    fn of_several_caps_the_most_spent_decides() {
        let ledger = ledger();
        charge(&ledger, "c", 900_000, 1_000); // 0.9 of $1; first request at 1 s
        let caps = budget(|b| {
            b.dollars = 1.0;
            b.steps = 100;
            b.tokens = 10_000_000;
            b.wall_clock_secs = 600;
        });
        // Steps 50% and tokens 9%: dollars (90%) decide.
        let status = ledger.status("c", 50, &caps, 2_000);
        assert!(
            matches!(
                status,
                BudgetStatus::Near {
                    cap: Cap::Dollars,
                    ..
                }
            ),
            "{status:?}"
        );
        // Steps at 100% beat dollars at 90%.
        let status = ledger.status("c", 100, &caps, 2_000);
        assert!(
            matches!(
                status,
                BudgetStatus::Spent {
                    cap: Cap::Steps,
                    ..
                }
            ),
            "{status:?}"
        );
        // Ten minutes after the first request, the clock beats steps at 100%.
        let status = ledger.status("c", 100, &caps, 1_000 + 660_000);
        assert_eq!(
            status,
            BudgetStatus::Spent {
                cap: Cap::WallClock,
                used: "11m 00s".into(),
                limit: "10m 00s".into()
            }
        );
    }

    #[test]
    fn amounts_read_as_a_human_writes_them() {
        assert_eq!(Cap::Dollars.show(4.119), "$4.12");
        assert_eq!(Cap::Tokens.show(1_234_567.0), "1,234,567 tokens");
        assert_eq!(Cap::Tokens.show(999.0), "999 tokens");
        assert_eq!(Cap::Steps.show(12.0), "12 steps");
        assert_eq!(Cap::WallClock.show(45.0), "45s");
        assert_eq!(Cap::WallClock.show(7380.0), "2h 03m");
    }
}
