//! The HTTP side: routing, forwarding, the streaming tee, conversation identity, admin API.

/// Options of `loopwarden serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Config file (TOML). Defaults are built in; see config/loopwarden.toml.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides the config and LOOPWARDEN_LISTEN).
    #[arg(long)]
    pub listen: Option<String>,
    /// Database URL, e.g. sqlite://loopwarden.db (overrides the config and LOOPWARDEN_DB).
    #[arg(long)]
    pub db: Option<String>,
}

/// Entry point of `loopwarden serve`.
pub fn serve_main(args: ServeArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("serve is not implemented yet")
}
