//! Names that several layers write the same way, kept below all of them: the policy a
//! request falls under when no other matches, and a team's name as matched and logged.
//! A leaf: it imports nothing of the crate, so the store, budgets, metrics and traces can
//! spell these names without depending on `crate::policy`.

use std::borrow::Cow;

/// The name of the policy that applies when no other matches.
pub const DEFAULT_POLICY: &str = "default";

/// A team's name as matched and logged: ASCII letters in lower case, so that `CI` and
/// `ci` are one team (its conversations, its policy, its row in the dashboard).
pub fn team_name(raw: Cow<'_, str>) -> Cow<'_, str> {
    if raw.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(raw.to_ascii_lowercase())
    } else {
        raw
    }
}
