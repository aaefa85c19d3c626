//! `loopwarden policies`: the policies a configuration declares, as `serve` would read
//! them (file, environment, flags), checked; and, given what a request carries, the policy
//! it would fall under. For trying a change before a reload applies it, and for reading
//! the precedence rather than working it out.

use crate::dialect::Dialect;
use crate::policy::{Client, Traffic};

/// Options of `loopwarden policies`: `serve`'s, and a request to place.
#[derive(Debug, Clone, clap::Args)]
pub struct PoliciesArgs {
    #[command(flatten)]
    pub serve: crate::proxy::ServeArgs,
    /// A request's team (`/t/{team}` or `x-loopwarden-team`).
    #[arg(long)]
    pub team: Option<String>,
    /// A request's API key, read from stdin (`-`), matched by its fingerprint.
    #[arg(long, value_name = "-")]
    pub key: Option<String>,
    /// A request's `user-agent`.
    #[arg(long, default_value = "")]
    pub user_agent: String,
    /// The model a request asks for.
    #[arg(long)]
    pub model: Option<String>,
    /// A request's API: openai_chat, openai_responses, anthropic, gemini.
    #[arg(long)]
    pub api: Option<String>,
}

/// Entry point of `loopwarden policies`.
pub fn run(args: PoliciesArgs) -> anyhow::Result<()> {
    // As `serve` reads it, but a secret the check does not use may be unset: said, not
    // refused.
    let loaded = args.serve.clone().load_config_read_only()?;
    for unset in &loaded.unset {
        eprintln!("warning: {unset}: `serve` will not start without it");
    }
    let set = loaded.config.policy_set()?;
    for p in set.iter() {
        let selector = serde_json::to_string(&p.selector)?;
        println!("{:<20} {:<10} match {selector}", p.name, p.mode.as_str());
    }
    for (policy, by) in set.shadowed() {
        eprintln!(
            "warning: policy {policy:?} never applies: {by:?}, tried before it, matches every request it matches"
        );
    }
    let asked = args.team.is_some()
        || args.key.is_some()
        || !args.user_agent.is_empty()
        || args.model.is_some()
        || args.api.is_some();
    if !asked {
        return Ok(());
    }
    let api = match args.api.as_deref() {
        Some(name) => Some(
            Dialect::ALL
                .into_iter()
                .find(|d| d.as_str() == name)
                .ok_or_else(|| anyhow::anyhow!("--api {name:?}: not one of the four APIs"))?,
        ),
        None => None,
    };
    let key_id = match args.key.as_deref() {
        Some("-") => {
            let mut key = String::new();
            std::io::stdin().read_line(&mut key)?;
            Some(crate::policy::key_id::of(&key))
        }
        Some(_) => anyhow::bail!("--key takes `-` (the key is read from stdin, never an argument)"),
        None => None,
    };
    let traffic = Traffic {
        team: args
            .team
            .as_deref()
            .map(|t| crate::names::team_name(t.into())),
        key_id,
        client: Client::of(&args.user_agent),
        user_agent: &args.user_agent,
        model: args.model.as_deref(),
        api,
    };
    let policy = set.select(&traffic);
    println!(
        "\nthis request (client {}) falls under: {} ({})",
        traffic.client.as_str(),
        policy.name,
        policy.mode.as_str()
    );
    Ok(())
}
