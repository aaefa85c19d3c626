//! The `[[policy]]` tables of the config file, and how each becomes a whole configuration.
//!
//! A policy's settings are, from weakest to strongest:
//! 1. the built-in defaults;
//! 2. the file's global `[detect]`, `[intervene]`, `[budget]` and `[log]` tables;
//! 3. the policy it `inherit`s (itself resolved the same way, to any depth);
//! 4. the policy's own `detect`, `intervene`, `budget` and `log` tables.
//!
//! Tables merge key by key, at every depth; any other value (a number, a string, a list such
//! as `intervene.profiles`) replaces the one below it whole. `mode` is inherited when the
//! policy does not set it; `match` never is (a policy matches only on what it says itself).
//! The merged tables are read exactly as the global ones are, so an unknown or misspelt
//! key anywhere is an error naming it, never a setting silently ignored.

use serde::Deserialize;

use super::select::Selector;
use super::Mode;
use crate::budget::BudgetConfig;
use crate::detect::DetectConfig;
use crate::intervene::InterveneConfig;
use crate::store::LogConfig;

/// One `[[policy]]` table as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyTable {
    pub name: String,
    /// Another policy whose settings this one starts from.
    pub inherit: Option<String>,
    pub mode: Option<Mode>,
    #[serde(rename = "match")]
    pub selector: Option<Selector>,
    pub detect: Option<toml::Table>,
    pub intervene: Option<toml::Table>,
    pub budget: Option<toml::Table>,
    pub log: Option<toml::Table>,
}

/// What the policies are resolved from: the file's `[[policy]]` tables and the global
/// settings they build on. `crate::config` hands these over, so that resolving a policy
/// needs nothing else of the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    pub policies: &'a [PolicyTable],
    pub detect: &'a DetectConfig,
    pub intervene: &'a InterveneConfig,
    pub budget: &'a BudgetConfig,
    pub log: &'a LogConfig,
}

/// The global settings every policy's own merge onto, as tables.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SectionTables {
    pub detect: toml::Table,
    pub intervene: toml::Table,
    pub budget: toml::Table,
    pub log: toml::Table,
}

impl SectionTables {
    /// The global settings as tables. Made from the settings themselves, not the file's
    /// text, so that what the environment or a caller set is the base too.
    pub fn of(config: &Sources<'_>) -> Result<SectionTables, PolicyError> {
        fn table<T: serde::Serialize>(
            section: &str,
            value: &T,
        ) -> Result<toml::Table, PolicyError> {
            let fail = |e: String| PolicyError {
                policy: DEFAULT.into(),
                problem: format!("`{section}` cannot be read back: {e}"),
            };
            let json = serde_json::to_value(value).map_err(|e| fail(e.to_string()))?;
            match json_to_toml(json) {
                Some(toml::Value::Table(t)) => Ok(t),
                _ => Err(fail("not a table".into())),
            }
        }
        Ok(SectionTables {
            detect: table("detect", config.detect)?,
            intervene: table("intervene", config.intervene)?,
            budget: table("budget", config.budget)?,
            log: table("log", config.log)?,
        })
    }
}

/// A JSON value as TOML, nulls left out (TOML has none; a missing key reads back as the
/// same default a null came from).
fn json_to_toml(value: serde_json::Value) -> Option<toml::Value> {
    use serde_json::Value as J;
    Some(match value {
        J::Null => return None,
        J::Bool(b) => toml::Value::Boolean(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        J::String(s) => toml::Value::String(s),
        J::Array(items) => toml::Value::Array(items.into_iter().filter_map(json_to_toml).collect()),
        J::Object(map) => toml::Value::Table(
            map.into_iter()
                .filter_map(|(k, v)| Some((k, json_to_toml(v)?)))
                .collect(),
        ),
    })
}

/// A policy's whole settings, merged and read.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub name: String,
    pub mode: Mode,
    pub selector: Selector,
    pub detect: DetectConfig,
    pub intervene: InterveneConfig,
    pub budget: BudgetConfig,
    pub log: LogConfig,
}

/// What is wrong with a policy, naming it and the key at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("policy {policy:?}: {problem}")]
pub struct PolicyError {
    pub policy: String,
    pub problem: String,
}

/// The name of the policy that applies when no other matches (`crate::names`).
pub const DEFAULT: &str = crate::names::DEFAULT_POLICY;

/// Every policy of the file resolved, in file order, and the default one (the file's
/// `default`, or the global settings under that name) last.
pub fn resolve_all(
    tables: &[PolicyTable],
    sections: &SectionTables,
) -> Result<Vec<Resolved>, PolicyError> {
    check_names(tables)?;
    let mut out = Vec::with_capacity(tables.len() + 1);
    for table in tables {
        out.push(resolve(table, tables, sections)?);
    }
    if !tables.iter().any(|t| t.name == DEFAULT) {
        let implicit = PolicyTable {
            name: DEFAULT.into(),
            inherit: None,
            mode: None,
            selector: None,
            detect: None,
            intervene: None,
            budget: None,
            log: None,
        };
        out.push(resolve(&implicit, tables, sections)?);
    }
    Ok(out)
}

/// Names are unique and not empty; `default` has no `match` (it is what applies when
/// nothing matches), and every other policy that is not only a base has one.
fn check_names(tables: &[PolicyTable]) -> Result<(), PolicyError> {
    for (i, t) in tables.iter().enumerate() {
        let fail = |problem: String| PolicyError {
            policy: t.name.clone(),
            problem,
        };
        if t.name.trim().is_empty() || t.name.chars().any(|c| c.is_control()) {
            return Err(fail("`name` must be a non-empty printable name".into()));
        }
        if tables[..i].iter().any(|o| o.name == t.name) {
            return Err(fail("two policies have this name".into()));
        }
        if t.name == DEFAULT && t.selector.is_some() {
            return Err(fail(
                "`default` applies when no other policy matches: it takes no `match`".into(),
            ));
        }
        if t.selector.as_ref().is_some_and(Selector::is_empty) {
            return Err(fail(
                "`match = {}` matches no request: name what to match (team, key_id, client, \
                 user_agent, model, api), or leave `match` out for a policy others inherit"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// One policy, merged down its inheritance chain and read.
fn resolve(
    table: &PolicyTable,
    tables: &[PolicyTable],
    sections: &SectionTables,
) -> Result<Resolved, PolicyError> {
    let fail = |problem: String| PolicyError {
        policy: table.name.clone(),
        problem,
    };
    let chain = chain(table, tables).map_err(fail)?;
    // Weakest first: the global tables, then the farthest ancestor, ..., then the policy.
    let mut detect = sections.detect.clone();
    let mut intervene = sections.intervene.clone();
    let mut budget = sections.budget.clone();
    let mut log = sections.log.clone();
    let mut mode = Mode::Enforce;
    for t in chain.iter().rev() {
        for (into, from) in [
            (&mut detect, &t.detect),
            (&mut intervene, &t.intervene),
            (&mut budget, &t.budget),
            (&mut log, &t.log),
        ] {
            if let Some(from) = from {
                merge(into, from);
            }
        }
        mode = t.mode.unwrap_or(mode);
    }
    let detect: DetectConfig = read("detect", detect).map_err(fail)?;
    crate::detect::registry::check_patterns(&detect).map_err(fail)?;
    let intervene: InterveneConfig = read("intervene", intervene).map_err(fail)?;
    intervene
        .validate()
        .map_err(|(key, problem)| fail(format!("`{key}`: {problem}")))?;
    let budget: BudgetConfig = read("budget", budget).map_err(fail)?;
    budget
        .validate()
        .map_err(|(key, problem)| fail(format!("`{key}`: {problem}")))?;
    Ok(Resolved {
        name: table.name.clone(),
        mode,
        selector: table.selector.clone().unwrap_or_default(),
        detect,
        intervene,
        budget,
        log: read("log", log).map_err(fail)?,
    })
}

/// `table` and its ancestors, nearest first; an unknown or circular `inherit` is an error.
fn chain<'a>(
    table: &'a PolicyTable,
    tables: &'a [PolicyTable],
) -> Result<Vec<&'a PolicyTable>, String> {
    let mut chain = vec![table];
    let mut at = table;
    while let Some(parent) = &at.inherit {
        let Some(next) = tables.iter().find(|t| &t.name == parent) else {
            let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
            return Err(format!(
                "`inherit`: no policy is named {parent:?}; the policies: {}",
                names.join(", ")
            ));
        };
        if chain.iter().any(|t| std::ptr::eq(*t, next)) {
            return Err(format!(
                "`inherit`: {parent:?} inherits, in the end, from itself"
            ));
        }
        chain.push(next);
        at = next;
    }
    Ok(chain)
}

/// `from` over `into`: tables merge key by key, anything else replaces.
fn merge(into: &mut toml::Table, from: &toml::Table) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) => merge(below, above),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// A merged table read as its section's settings; the error names the section and the key.
fn read<T: serde::de::DeserializeOwned>(section: &str, table: toml::Table) -> Result<T, String> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| format!("`{section}`: {}", e.message().trim_end()))
}
