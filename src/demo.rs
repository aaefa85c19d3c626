//! `loopwarden demo`: loopwarden and a scripted looping agent, in-process, in ten seconds.

/// Options of `loopwarden demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("demo is not implemented yet")
}
