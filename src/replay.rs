//! `loopwarden replay`: the detection engine over recorded conversations.

/// Options of `loopwarden replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// JSONL file: one object per line with `id` and `messages` (OpenAI Chat format).
    pub file: std::path::PathBuf,
    /// Config file (TOML) whose `[detect]` and policy settings to use.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Also print harm and savings figures (needs `resolved` labels in the input).
    #[arg(long)]
    pub summary: bool,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("replay is not implemented yet")
}
