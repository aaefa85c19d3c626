//! Alerts: a webhook for each run a policy stopped or held, so that a team hears of it where
//! it already looks (a halted agent's exit status reads as success to most harnesses).
//!
//! What is alerted on is decided here ([`AlertEvent::of`]) from the ruling as logged, and
//! what is sent ([`Alert::body`]); the proxy posts it (`crate::proxy::upstream::webhook`), off the
//! request path. Settings: `[intervene.alerts]`, per policy like every `[intervene]` key.

use serde::{Deserialize, Serialize};

use super::ruling::{Act, Ruling, Source, Stop};
use super::Applied;

/// The `[intervene.alerts]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// URLs that receive a POST for each event in `on`. None: no alerts.
    pub webhooks: Vec<String>,
    /// The body: `json` (the alert's fields) or `slack` (`{"text": ...}`, which Slack's
    /// incoming webhooks and the chat tools compatible with them read).
    pub format: AlertFormat,
    /// The events alerted on.
    pub on: Vec<AlertEvent>,
    /// Per-webhook timeout; a slow or failing hook never delays anything else.
    pub timeout_ms: u64,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            webhooks: Vec::new(),
            format: AlertFormat::Json,
            on: vec![
                AlertEvent::Halt,
                AlertEvent::Block,
                AlertEvent::Budget,
                AlertEvent::Held,
            ],
            timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertFormat {
    Json,
    Slack,
}

/// What a policy did to a run that someone should hear of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertEvent {
    /// Detection halted the run (its request answered by the halt).
    Halt,
    /// The looping call in an answer was replaced by the halt.
    Block,
    /// A budget cap was spent: the run was halted.
    Budget,
    /// A request is held for a human's decision.
    Held,
}

impl AlertEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertEvent::Halt => "halt",
            AlertEvent::Block => "block",
            AlertEvent::Budget => "budget",
            AlertEvent::Held => "held",
        }
    }

    /// The event a ruling carried out is, if any. Only the policy's own stops: the sticky
    /// halt answered again was alerted the first time, and a person's halt (an operator,
    /// a verdict) is known to the person. A shadow policy stops nothing, so alerts nothing.
    pub fn of(ruling: &Ruling, applied: Applied) -> Option<AlertEvent> {
        if ruling.source != Source::Policy {
            return None;
        }
        match (applied, ruling.act) {
            (Applied::Blocked, _) => Some(AlertEvent::Block),
            (Applied::Held, _) => Some(AlertEvent::Held),
            (Applied::Halted, Act::Halt(Stop::Budget)) => Some(AlertEvent::Budget),
            (Applied::Halted, _) => Some(AlertEvent::Halt),
            _ => None,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            AlertEvent::Halt => "halted",
            AlertEvent::Block => "blocked a looping call and halted",
            AlertEvent::Budget => "halted (budget spent)",
            AlertEvent::Held => "is holding a request of",
        }
    }
}

/// What `encodeURIComponent` leaves as it is: letters, digits and `-_.!~*'()`.
const URI_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// One alert, as the intervention log has it.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    pub event: AlertEvent,
    pub policy: String,
    pub conversation: String,
    /// The decision's detector (`budget_cap` for a budget).
    pub detector: String,
    pub reason: String,
    /// The finding that led the decision, in words (masked as the log keeps it).
    pub finding: String,
    pub at_ms: i64,
}

impl Alert {
    /// Where a human reads the run: the dashboard's timeline of the conversation, the
    /// view its page draws for `#/conversation/ID` (the id percent-encoded, as the page
    /// decodes it). Through the login form when the browser has no session yet: the form
    /// carries the `#` view on (`ui/login.js`).
    pub fn timeline(&self, public_url: &str) -> String {
        format!(
            "{}/ui/#/conversation/{}",
            public_url.trim_end_matches('/'),
            percent_encoding::utf8_percent_encode(&self.conversation, URI_COMPONENT)
        )
    }

    /// The webhook's body in `format`; `public_url` is the proxy's address as users reach
    /// it (`server.public_url`).
    pub fn body(&self, format: AlertFormat, public_url: &str) -> serde_json::Value {
        let timeline = self.timeline(public_url);
        match format {
            AlertFormat::Json => serde_json::json!({
                "event": "loopwarden.alert",
                "kind": self.event,
                "policy": self.policy,
                "conversation": self.conversation,
                "detector": self.detector,
                "reason": self.reason,
                "finding": self.finding,
                "at_ms": self.at_ms,
                "timeline": timeline,
            }),
            AlertFormat::Slack => {
                let finding = match self.finding.as_str() {
                    "" => String::new(),
                    f => format!("\n> {f}"),
                };
                serde_json::json!({
                    "text": format!(
                        "loopwarden {} conversation `{}` (policy `{}`, {}): {}{}\n<{}|Timeline>",
                        self.event.verb(),
                        self.conversation,
                        self.policy,
                        self.detector,
                        self.reason,
                        finding,
                        timeline,
                    )
                })
            }
        }
    }
}

/// Where the proxy takes alerts to be sent; the intervention service calls it as it logs
/// the ruling (and knows nothing of HTTP).
pub type AlertSink = std::sync::Arc<dyn Fn(&AlertsConfig, Alert) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    fn alert() -> Alert {
        Alert {
            event: AlertEvent::Halt,
            policy: "ci".into(),
            conversation: "run-1".into(),
            detector: "fail_loop".into(),
            reason: "the same test failed 4 times".into(),
            finding: "`python3 t.py` failed the same way 4 times".into(),
            at_ms: 5,
        }
    }

    #[test]
    fn both_formats_carry_the_policy_the_conversation_the_finding_and_the_timeline() {
        let a = alert();
        let json = a.body(AlertFormat::Json, "http://proxy:8788/");
        assert_eq!(json["kind"], "halt");
        assert_eq!(json["policy"], "ci");
        assert_eq!(
            json["timeline"],
            "http://proxy:8788/ui/#/conversation/run-1"
        );
        let slack = a.body(AlertFormat::Slack, "http://proxy:8788");
        let text = slack["text"].as_str().unwrap();
        for part in [
            "run-1",
            "`ci`",
            "failed the same way",
            "<http://proxy:8788/ui/#/conversation/run-1|Timeline>",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn an_id_that_is_not_a_plain_word_is_percent_encoded_in_the_link() {
        let a = Alert {
            conversation: "my run/2?#é".into(),
            ..alert()
        };
        assert_eq!(
            a.timeline("https://lw.example"),
            "https://lw.example/ui/#/conversation/my%20run%2F2%3F%23%C3%A9"
        );
    }
}
