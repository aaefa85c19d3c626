//! The `loopwarden` command line. Each subcommand's options and behaviour live in the
//! module that owns it; this file only dispatches.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "input never panics the proxy: errors are answered or logged (Cargo.toml)"
)]

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "loopwarden",
    version,
    about = "A reverse proxy that keeps LLM coding agents out of unproductive loops"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve(loopwarden::proxy::ServeArgs),
    /// Ask a running proxy (at the address its config names) whether it is up: a health check.
    Health(loopwarden::proxy::ServeArgs),
    /// Run the detection engine over recorded conversations (JSONL) and print its decisions.
    Replay(loopwarden::replay::ReplayArgs),
    /// Run a scripted mock model server (the four APIs) for tests and demos.
    #[command(after_long_help = loopwarden::mock::SCRIPT_HELP)]
    Mock(loopwarden::mock::MockArgs),
    /// Start loopwarden and a scripted looping agent in-process and show what happens.
    Demo(loopwarden::demo::DemoArgs),
    /// Print the fingerprint of the API key read from stdin, for a policy's `match.key_id`
    /// (the key itself never goes into the config or the log).
    KeyId,
    /// Check the config's policies and list them in the order they are tried; with a
    /// request's team, key, user-agent, model or API, say which policy it falls under.
    Policies(loopwarden::policies::PoliciesArgs),
    /// Run a command (an agent) as one conversation of a running proxy, its base-URL
    /// variables pointed at it, after checking the proxy, the token and the team's policy.
    /// Exit 3: loopwarden halted the run; 4: the proxy saw no request of it; 125: the
    /// checks failed (the command did not start) or the run's state could not be read;
    /// else the command's own status, as a shell gives it (126, 127, 128 + signal).
    Run(loopwarden::run::RunArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // Its exit status is the run's: its own.
        Command::Run(args) => return loopwarden::run::main(args),
        // Its exit status says whether the log was written whole at the stop.
        Command::Serve(args) => match loopwarden::proxy::serve_main(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Health(args) => loopwarden::proxy::serve::check_health(args),
        Command::Replay(args) => loopwarden::replay::run(args),
        Command::Mock(args) => loopwarden::mock::run(args),
        Command::Demo(args) => loopwarden::demo::run(args),
        Command::KeyId => loopwarden::policy::key_id::run(),
        Command::Policies(args) => loopwarden::policies::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loopwarden: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
