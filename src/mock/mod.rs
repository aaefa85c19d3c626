//! A scripted mock model server speaking the four APIs, for tests, the e2e suite and the demo.

/// Options of `loopwarden mock`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Script file (JSON).
    #[arg(long)]
    pub script: Option<std::path::PathBuf>,
}

pub fn run(args: MockArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("mock is not implemented yet")
}
