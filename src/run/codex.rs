//! Pointing Codex at the proxy under the run's id. Codex reads none of the base-URL
//! variables `run` sets (`OPENAI_BASE_URL` included): its provider's base URL comes from
//! its config. It honours `-c key=value` overrides given before its subcommand, so when the
//! command is `codex`, `run` puts these in front of its arguments:
//!
//! - `openai_base_url="{proxy}/t/{team}/c/{id}/v1"`: Codex's built-in OpenAI provider
//!   (no `model_provider` in the config) then talks to the proxy, under the run's id;
//! - for a provider of the user's config (`[model_providers.NAME]`, e.g. the README's
//!   `loopwarden`), whose base URL is the config's: two `env_http_headers` entries, so
//!   that its requests state the run's id and team (`x-loopwarden-conversation`, which
//!   wins over Codex's own `thread-id`, and `x-loopwarden-team`) from the variables `run`
//!   sets. Its other headers are kept (a dotted override adds one key).
//!
//! The provider in use is the one a `-c model_provider=...` argument names, else the one
//! the `--profile`'s file names (`$CODEX_HOME/NAME.config.toml`), else `config.toml`'s.

use std::path::{Path, PathBuf};

/// The variable holding the run's conversation id.
pub const CONVERSATION_VARIABLE: &str = "LOOPWARDEN_CONVERSATION";

/// The variable holding the run's team (set only with `--team`).
pub const TEAM_VARIABLE: &str = "LOOPWARDEN_TEAM";

/// Codex's built-in provider, which `openai_base_url` points.
const BUILT_IN: &str = "openai";

/// Whether the command is Codex's CLI, by its file name.
pub fn is_codex(program: &str) -> bool {
    Path::new(program)
        .file_name()
        .is_some_and(|name| name == "codex")
}

/// Codex's config directory: `$CODEX_HOME`, else `~/.codex`.
pub fn home() -> Option<PathBuf> {
    match std::env::var_os("CODEX_HOME") {
        Some(home) if !home.is_empty() => Some(PathBuf::from(home)),
        _ => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".codex")),
    }
}

/// The arguments to put before Codex's own (`args`), for a run whose base URL (the proxy,
/// `/t/{team}` and `/c/{id}`) is `base`.
pub fn overrides(base: &str, args: &[String], codex_home: Option<&Path>) -> Vec<String> {
    let mut out = vec!["-c".to_string(), format!("openai_base_url=\"{base}/v1\"")];
    let Some(provider) = custom_provider(args, codex_home) else {
        return out;
    };
    if !provider
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        eprintln!(
            "loopwarden run: Codex's provider {provider:?} cannot be named in a -c override; \
             add env_http_headers to it yourself (README, Codex)"
        );
        return out;
    }
    for (header, variable) in [
        ("x-loopwarden-conversation", CONVERSATION_VARIABLE),
        ("x-loopwarden-team", TEAM_VARIABLE),
    ] {
        out.push("-c".to_string());
        out.push(format!(
            "model_providers.{provider}.env_http_headers.{header}=\"{variable}\""
        ));
    }
    out
}

/// The provider Codex will use, when it is one the user's config declares (a table
/// `[model_providers.NAME]` in `config.toml` or the profile's file).
fn custom_provider(args: &[String], codex_home: Option<&Path>) -> Option<String> {
    let base = codex_home.and_then(|home| read_table(&home.join("config.toml")));
    let profile = flag_value(args, &["-p", "--profile"])
        .zip(codex_home)
        .and_then(|(name, home)| read_table(&home.join(format!("{name}.config.toml"))));
    let files = [profile.as_ref(), base.as_ref()];
    let chosen = config_override(args, "model_provider").or_else(|| {
        files
            .iter()
            .flatten()
            .find_map(|t| t.get("model_provider")?.as_str().map(str::to_string))
    })?;
    let declared = files.iter().flatten().any(|t| {
        t.get("model_providers")
            .and_then(|p| p.get(&chosen))
            .is_some()
    });
    (declared && chosen != BUILT_IN).then_some(chosen)
}

fn read_table(path: &Path) -> Option<toml::Table> {
    std::fs::read_to_string(path).ok()?.parse().ok()
}

/// The value of the last `flag VALUE` or `flag=VALUE` among `args`, for any of `names`.
fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if names.contains(&arg.as_str()) {
            found = iter.next().map(String::as_str).or(found);
        } else if let Some(value) = names.iter().find_map(|n| {
            arg.strip_prefix(n)
                .and_then(|rest| rest.strip_prefix('='))
                .filter(|_| n.starts_with("--"))
        }) {
            found = Some(value);
        }
    }
    found
}

/// The value a `-c key=value` (or `--config`) argument gives `key`, unquoted as Codex
/// parses it (TOML, else the raw text); the last one wins, as in Codex.
fn config_override(args: &[String], key: &str) -> Option<String> {
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let setting = match arg.as_str() {
            "-c" | "--config" => iter.next().map(String::as_str),
            other => other.strip_prefix("--config="),
        };
        let Some((k, v)) = setting.and_then(|s| s.split_once('=')) else {
            continue;
        };
        if k.trim() == key {
            let v = v.trim();
            let parsed = format!("v = {v}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|t| t.get("v")?.as_str().map(str::to_string));
            found = Some(parsed.unwrap_or_else(|| v.to_string()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "http://127.0.0.1:8788/t/ci/c/run-1";

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn home_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    const README_CONFIG: &str = r#"
model_provider = "loopwarden"
[model_providers.loopwarden]
name = "loopwarden"
base_url = "http://127.0.0.1:8788/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"#;

    #[test]
    fn codex_is_known_by_its_file_name() {
        assert!(is_codex("codex"));
        assert!(is_codex("/tmp/lw-agents/codex/node_modules/.bin/codex"));
        assert!(!is_codex("codex-helper"));
        assert!(!is_codex("claude"));
    }

    #[test]
    fn the_built_in_provider_gets_the_runs_base_url() {
        let home = home_with(&[("config.toml", "model = \"gpt-5.5\"\n")]);
        let out = overrides(BASE, &args(&["exec", "hi"]), Some(home.path()));
        assert_eq!(out, ["-c", &format!("openai_base_url=\"{BASE}/v1\"")]);
        // No config at all: the same.
        assert_eq!(overrides(BASE, &args(&["exec"]), None).len(), 2);
    }

    #[test]
    fn a_configured_provider_states_the_runs_id_in_headers() {
        let home = home_with(&[("config.toml", README_CONFIG)]);
        let out = overrides(BASE, &args(&["exec", "hi"]), Some(home.path()));
        assert!(out.contains(
            &"model_providers.loopwarden.env_http_headers.x-loopwarden-conversation=\"LOOPWARDEN_CONVERSATION\""
                .to_string()
        ), "{out:?}");
        assert!(out.contains(
            &"model_providers.loopwarden.env_http_headers.x-loopwarden-team=\"LOOPWARDEN_TEAM\""
                .to_string()
        ), "{out:?}");
    }

    #[test]
    fn the_provider_in_use_is_the_arguments_then_the_profiles_then_the_configs() {
        let two = format!("{README_CONFIG}\n[model_providers.other]\nname = \"other\"\n");
        let home = home_with(&[
            ("config.toml", &two),
            ("work.config.toml", "model_provider = \"other\"\n"),
        ]);
        let provider = |list: &[&str]| custom_provider(&args(list), Some(home.path()));
        assert_eq!(provider(&["exec"]).as_deref(), Some("loopwarden"));
        assert_eq!(provider(&["-p", "work", "exec"]).as_deref(), Some("other"));
        assert_eq!(
            provider(&["--profile=work", "exec"]).as_deref(),
            Some("other")
        );
        assert_eq!(
            provider(&["-p", "work", "-c", "model_provider=\"loopwarden\"", "exec"]).as_deref(),
            Some("loopwarden")
        );
        // The built-in one, or one no file declares: nothing to add headers to.
        assert_eq!(provider(&["-c", "model_provider=openai"]), None);
        assert_eq!(provider(&["--config", "model_provider=\"nowhere\""]), None);
    }
}
