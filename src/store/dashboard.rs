//! What the dashboard (`/ui`, `crate::proxy::operator::dashboard`) reads from the log beyond the admin
//! API's views ([`super::query`]): the conversation list with its filters, each alert with
//! the human verdict on it, interventions over time, the halts whose savings the overview
//! estimates, and each detector's precision from the verdicts. The SQL is the backend's
//! (`sqlite/dashboard.rs`); none of it runs on the proxied request path.

use serde::{Deserialize, Serialize};

use super::query::ConversationSummary;
use super::{Backend, Error, Store};

/// The conversation list's filters; each one given must hold.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConversationFilter {
    /// The policy of the conversation's latest request.
    pub policy: Option<String>,
    pub team: Option<String>,
    pub client: Option<String>,
    pub model: Option<String>,
    /// The latest request's decision (`observe`, `nudge`, `halt`...; `would_halt`... under
    /// a shadow policy).
    pub decision: Option<String>,
}

impl ConversationFilter {
    /// An empty filter value is no filter (a form's unset field); a team is written as the
    /// log has it (`crate::names::team_name`: `CI` finds `ci`).
    pub fn normalized(self) -> ConversationFilter {
        let set = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        ConversationFilter {
            policy: set(self.policy),
            team: set(self.team).map(|t| crate::names::team_name(t.as_str().into()).into_owned()),
            client: set(self.client),
            model: set(self.model),
            decision: set(self.decision),
        }
    }
}

/// One line of the dashboard's conversation list.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ListedConversation {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub summary: ConversationSummary,
    /// The policy of its latest request.
    pub policy: Option<String>,
    pub team: Option<String>,
}

/// A human's word on an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The alert was right: the agent was stuck.
    Right,
    /// A false alarm.
    Wrong,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Right => "right",
            Verdict::Wrong => "wrong",
        }
    }
}

/// What a verdict is given on: a finding (`findings.id`) or an intervention
/// (`interventions.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Finding(i64),
    Intervention(i64),
}

/// A verdict as stored: on what, which detector it judges, and the conversation.
#[derive(Debug, Clone, Serialize)]
pub struct Recorded {
    pub id: i64,
    pub conversation_id: String,
    pub detector: String,
    pub verdict: Verdict,
}

/// A finding with its id and the latest verdict on it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct FindingAlert {
    pub id: i64,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub finding: super::FindingRow,
    pub verdict: Option<String>,
    pub note: Option<String>,
}

/// An intervention with its id and the latest verdict on it; `resumed`: a halt that a
/// human or an operator lifted afterwards (counted wrong when nobody said otherwise).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct InterventionAlert {
    pub id: i64,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub intervention: super::InterventionRow,
    pub verdict: Option<String>,
    pub note: Option<String>,
    pub resumed: bool,
}

/// A conversation's alerts, in time order, with their ids for the feedback buttons.
#[derive(Debug, Clone, Serialize)]
pub struct Alerts {
    pub findings: Vec<FindingAlert>,
    pub interventions: Vec<InterventionAlert>,
}

/// One detector's precision on this proxy's traffic: `right / (right + wrong)`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Precision {
    pub detector: String,
    pub right: i64,
    /// Said wrong, or a halt a human lifted without a verdict (`implied_wrong` of them).
    pub wrong: i64,
    pub implied_wrong: i64,
    /// `None` without any verdict.
    #[sqlx(skip)]
    pub precision: Option<f64>,
}

impl Precision {
    fn with_ratio(mut self) -> Precision {
        let judged = self.right + self.wrong;
        self.precision = (judged > 0).then(|| self.right as f64 / judged as f64);
        self
    }
}

/// Interventions the policies made in one time bucket, by detector and policy.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct InterventionCount {
    /// The bucket's start, ms since the epoch.
    pub bucket_ms: i64,
    pub detector: String,
    pub policy: String,
    /// The action, or a shadow policy's `would_<act>`.
    pub action: String,
    pub count: i64,
}

/// A halt by a policy and the run before it, for the overview's estimate of what it saved.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct HaltedRun {
    pub conversation_id: String,
    pub detector: String,
    pub halted_ms: i64,
    /// The run's first request.
    pub first_ms: i64,
    /// Steps the history carried at the halt.
    pub steps: i64,
    /// What the run's answers cost before the halt.
    pub cost_usd: f64,
    /// When it was resumed (by a human or an operator); `None`: still halted.
    pub resumed_ms: Option<i64>,
}

/// Counts for the overview's header.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Totals {
    pub requests: i64,
    pub requests_in_window: i64,
    pub conversations: i64,
    pub conversations_in_window: i64,
}

impl Store {
    /// Conversations matching `filter`, most recently active first.
    pub async fn listed_conversations(
        &self,
        filter: &ConversationFilter,
        limit: i64,
    ) -> Result<Vec<ListedConversation>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::conversations(&db.pool(), filter, limit).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::conversations(db.pool(), filter, limit).await?)
            }
        }
    }

    /// A conversation's findings and interventions with their ids and verdicts.
    pub async fn alerts(&self, conversation: &str) -> Result<Alerts, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::alerts(&db.pool(), conversation).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::alerts(db.pool(), conversation).await?)
            }
        }
    }

    /// Stores a verdict on a finding or an intervention; `None` when there is no such one.
    pub async fn give_feedback(
        &self,
        target: Target,
        verdict: Verdict,
        note: &str,
    ) -> Result<Option<Recorded>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(super::sqlite::dashboard::give_feedback(
                &db.pool(),
                target,
                verdict,
                note,
                super::now_ms(),
            )
            .await?),
            Backend::Postgres(db) => Ok(super::postgres::dashboard::give_feedback(
                db.pool(),
                target,
                verdict,
                note,
                super::now_ms(),
            )
            .await?),
        }
    }

    /// Each detector's precision from the verdicts (and the halts humans lifted).
    /// `team`: its conversations' alerts only; `None`: every conversation's.
    pub async fn precision(&self, team: Option<&str>) -> Result<Vec<Precision>, Error> {
        let rows = match &self.backend {
            Backend::Sqlite(db) => super::sqlite::dashboard::precision(&db.pool(), team).await?,
            Backend::Postgres(db) => super::postgres::dashboard::precision(db.pool(), team).await?,
        };
        Ok(rows.into_iter().map(Precision::with_ratio).collect())
    }

    /// The policies' interventions since `since_ms`, counted per `bucket_ms`.
    pub async fn intervention_counts(
        &self,
        since_ms: i64,
        bucket_ms: i64,
        team: Option<&str>,
    ) -> Result<Vec<InterventionCount>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(super::sqlite::dashboard::intervention_counts(
                &db.pool(),
                since_ms,
                bucket_ms.max(1),
                team,
            )
            .await?),
            Backend::Postgres(db) => Ok(super::postgres::dashboard::intervention_counts(
                db.pool(),
                since_ms,
                bucket_ms.max(1),
                team,
            )
            .await?),
        }
    }

    /// The halts the policies made since `since_ms`, with the runs before them.
    pub async fn halted_runs(
        &self,
        since_ms: i64,
        team: Option<&str>,
    ) -> Result<Vec<HaltedRun>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::halted_runs(&db.pool(), since_ms, team).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::halted_runs(db.pool(), since_ms, team).await?)
            }
        }
    }

    /// Requests and conversations, in all and since `since_ms`.
    pub async fn totals(&self, since_ms: i64, team: Option<&str>) -> Result<Totals, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::totals(&db.pool(), since_ms, team).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::totals(db.pool(), since_ms, team).await?)
            }
        }
    }

    /// The team a conversation's requests named, as the log holds it (`Some(None)`: none
    /// did); `None` for a conversation the log does not hold.
    pub async fn conversation_team(&self, id: &str) -> Result<Option<Option<String>>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::conversation_team(&db.pool(), id).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::conversation_team(db.pool(), id).await?)
            }
        }
    }

    /// The conversation of a finding or an intervention; `None` when there is no such one.
    pub async fn alert_conversation(&self, target: Target) -> Result<Option<String>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(super::sqlite::dashboard::alert_conversation(&db.pool(), target).await?)
            }
            Backend::Postgres(db) => {
                Ok(super::postgres::dashboard::alert_conversation(db.pool(), target).await?)
            }
        }
    }

    /// The ids of `team`'s conversations active since `since_ms`.
    pub async fn team_conversations(
        &self,
        team: &str,
        since_ms: i64,
    ) -> Result<Vec<String>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => {
                Ok(
                    super::sqlite::dashboard::team_conversations(&db.pool(), team, since_ms)
                        .await?,
                )
            }
            Backend::Postgres(db) => {
                Ok(
                    super::postgres::dashboard::team_conversations(db.pool(), team, since_ms)
                        .await?,
                )
            }
        }
    }
}
