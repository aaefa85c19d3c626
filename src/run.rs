//! `loopwarden run -- COMMAND`: runs an agent (or any command) as one conversation of a
//! running proxy, and tells CI whether loopwarden halted it. A halted agent usually exits
//! 0 (the halt reads to it as the model's last answer), so without this a CI job cannot
//! tell a halted run from a good one.
//!
//! The command gets the common base-URL variables pointed at the proxy under a
//! conversation id of its own (`/c/{id}`, after `/t/{team}` when given), and
//! `LOOPWARDEN_CONVERSATION`; once it exits, the proxy's admin API says whether the
//! conversation is halted. The exit status is then [`EXIT_HALTED`] when it is, else the
//! command's own.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

/// The exit status when loopwarden halted the run (whatever the command's own was).
pub const EXIT_HALTED: u8 = 3;

/// The exit status when the run could not be started or its state not read.
pub const EXIT_ERROR: u8 = 125;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The proxy's URL as the command reaches it.
    #[arg(long, env = "LOOPWARDEN_URL", default_value = "http://127.0.0.1:8788")]
    pub proxy: String,
    /// The team the run belongs to (its policy's `match.team`).
    #[arg(long)]
    pub team: Option<String>,
    /// The run's conversation id (letters, digits and `-_.:@+=`); a new one by default.
    #[arg(long)]
    pub id: Option<String>,
    /// The admin token, when the proxy has one (to read whether the run was halted).
    #[arg(long, env = "LOOPWARDEN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The variables the agents and SDKs read their base URL from (CLIENTS.md), and the path
/// each wants after the proxy's prefix: OpenAI's SDKs and litellm include `/v1`,
/// Anthropic's and Gemini's add their own.
const BASE_URL_VARIABLES: [(&str, &str); 4] = [
    ("OPENAI_BASE_URL", "/v1"),
    ("OPENAI_API_BASE", "/v1"),
    ("ANTHROPIC_BASE_URL", ""),
    ("GOOGLE_GEMINI_BASE_URL", ""),
];

/// How long the run's state is looked for once the command has exited: its last request
/// may still be on its way into the log.
const STATE_WAIT: Duration = Duration::from_secs(5);

/// Entry point of `loopwarden run`.
pub fn main(args: RunArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("loopwarden run: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<u8> {
    let id = match args.id {
        Some(id) if valid_id(&id) => id,
        Some(id) => anyhow::bail!("--id {id:?}: use letters, digits and -_.:@+= (at most 128)"),
        None => format!("run-{:016x}", fastrand::u64(..)),
    };
    let proxy = args.proxy.trim_end_matches('/');
    let base = match &args.team {
        Some(team) => format!(
            "{proxy}/t/{}/c/{id}",
            percent_encoding::utf8_percent_encode(team, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => format!("{proxy}/c/{id}"),
    };
    let Some((program, rest)) = args.command.split_first() else {
        anyhow::bail!("no command to run (loopwarden run -- COMMAND)");
    };
    let mut command = std::process::Command::new(program);
    command.args(rest).env("LOOPWARDEN_CONVERSATION", &id);
    for (variable, path) in BASE_URL_VARIABLES {
        command.env(variable, format!("{base}{path}"));
    }
    let status = command
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {program:?}: {e}"))?;
    let own = status.code().map_or(EXIT_ERROR, |c| c.clamp(0, 255) as u8);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let state = runtime.block_on(state(proxy, &id, args.admin_token.as_deref()))?;
    Ok(match state {
        State::Halted => {
            eprintln!(
                "loopwarden run: loopwarden halted this run (conversation {id}); exit status {EXIT_HALTED}"
            );
            EXIT_HALTED
        }
        State::Running => own,
        State::NotSeen => {
            eprintln!(
                "loopwarden run: the proxy saw no model request of this run (conversation {id}): \
                 does the command read one of {}?",
                BASE_URL_VARIABLES.map(|(v, _)| v).join(", ")
            );
            own
        }
    })
}

/// Ids the proxy keeps as they are (`crate::proxy::identity`): a plain token.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@+=".contains(&b))
}

enum State {
    Halted,
    Running,
    NotSeen,
}

/// The run's conversation as the proxy's admin API has it.
async fn state(proxy: &str, id: &str, token: Option<&str>) -> anyhow::Result<State> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = format!(
        "{proxy}/admin/api/conversations/{}",
        percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
    );
    let deadline = tokio::time::Instant::now() + STATE_WAIT;
    loop {
        let mut request = client.get(&url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot ask the proxy at {proxy} about the run: {e}"))?;
        let status = answer.status();
        let body = answer.bytes().await?;
        match status.as_u16() {
            200 => {
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                return Ok(match v["halted"].as_bool() {
                    Some(true) => State::Halted,
                    _ => State::Running,
                });
            }
            404 if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            404 => return Ok(State::NotSeen),
            _ => anyhow::bail!(
                "the proxy's admin API answered {status} about the run: {} (LOOPWARDEN_ADMIN_TOKEN?)",
                String::from_utf8_lossy(&body).trim()
            ),
        }
    }
}
