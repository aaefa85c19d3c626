//! Budgets per conversation: hard caps on what one run may spend (steps, tokens, dollars,
//! wall-clock time), enforced before the next call rather than reported after it. A
//! conversation past `warn_at` of any cap gets a reminder to wrap up; one that reaches a cap
//! gets the protocol-correct halt reply and stays halted like any halt.
//!
//! What is spent: [`Usage`] (the tokens of an answer, in the same terms for every API),
//! [`Prices`] (the `[prices]` table and the built-in list prices), and the [`Ledger`] (each
//! conversation's spend, and where it stands against its budget: [`Ledger::status`]). What
//! the next call will spend, before it is made: [`estimate`] (its input, from its body).
//!
//! The `[budget]` table is the global setting; a policy overrides it (`crate::policy`).
//! Not to be confused with the `budget` detector (`[detect.budget]`), which shrinks and
//! grows an adaptive step allowance with the run's progress and takes part in detection.

pub mod estimate;
mod ledger;
mod prices;
mod usage;

pub use ledger::{BudgetStatus, Cap, Charge, Cost, Ledger, NextCall, PolicySpend, Spend, Used};
pub use prices::{Price, Prices, BUILT_IN};
pub use usage::Usage;

use serde::{Deserialize, Serialize};

/// The `[budget]` table. Every cap is off at 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Steps (assistant turns) per conversation.
    pub steps: u64,
    /// Tokens per conversation: input (cached or not, cache writes too) plus output, as the
    /// responses' usage reports them (`Usage::total`).
    pub tokens: u64,
    /// US dollars per conversation, from the usage and the price table (`[prices]`);
    /// checked with the next call's estimated input counted in ([`estimate`]).
    pub dollars: f64,
    /// Seconds from the conversation's first request.
    pub wall_clock_secs: u64,
    /// Share of a cap (0-1) past which each request gets the wrap-up reminder.
    pub warn_at: f64,
}

impl Default for BudgetConfig {
    fn default() -> BudgetConfig {
        BudgetConfig {
            steps: 0,
            tokens: 0,
            dollars: 0.0,
            wall_clock_secs: 0,
            warn_at: 0.8,
        }
    }
}

impl BudgetConfig {
    /// No cap is set: nothing to look up for a request.
    pub fn is_unlimited(&self) -> bool {
        self.steps == 0 && self.tokens == 0 && self.dollars == 0.0 && self.wall_clock_secs == 0
    }

    /// Checks the values; `(key, problem)` names the first wrong one.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(self.dollars >= 0.0 && self.dollars.is_finite()) {
            return Err((
                "budget.dollars",
                "must be 0 (none) or a positive amount".into(),
            ));
        }
        if !(self.warn_at > 0.0 && self.warn_at <= 1.0) {
            return Err(("budget.warn_at", "must be a share in (0, 1]".into()));
        }
        Ok(())
    }
}
