//! `loopwarden run -- COMMAND`: runs an agent (or any command) as one conversation of a
//! running proxy, and tells CI whether loopwarden halted it. A halted agent usually exits
//! 0 (the halt reads to it as the model's last answer), so without this a CI job cannot
//! tell a halted run from a good one.
//!
//! In order:
//! 1. **Preflight**, before the command starts: the proxy answers `/healthz`, the admin
//!    token is accepted, and with `--team` a policy names the team (a mistyped team would
//!    run the whole agent under the default policy). A failure is [`EXIT_ERROR`], and the
//!    command never starts.
//! 2. **The command**, with the common base-URL variables pointed at the proxy under a
//!    conversation id of its own (`/c/{id}`, after `/t/{team}` when given), and
//!    `LOOPWARDEN_CONVERSATION` / `LOOPWARDEN_TEAM`. Codex reads none of the base-URL
//!    variables; when the command is `codex`, [`codex`] points it at the proxy under the
//!    run's id with `-c` overrides Codex honours.
//! 3. **The verdict**, from the proxy's admin API once the command has ended:
//!    [`EXIT_HALTED`] when loopwarden halted the run; [`EXIT_UNSEEN`] when the proxy saw
//!    no request of it and the command said success (it talked to something else, or to
//!    nothing); else the command's own status, as a shell gives it: 128 + the signal for a
//!    command killed by one, 127 for a command not found, 126 for one that cannot run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

mod codex;

/// The exit status when loopwarden halted the run (whatever the command's own was).
pub const EXIT_HALTED: u8 = 3;

/// The exit status when the command succeeded but the proxy saw no request of the run:
/// its agent did not go through loopwarden, so nothing watched it.
pub const EXIT_UNSEEN: u8 = 4;

/// The exit status when the run could not be started (the preflight failed) or its state
/// not read.
pub const EXIT_ERROR: u8 = 125;

/// As shells answer a command that exists but cannot be run.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

/// As shells answer a command that does not exist.
pub const EXIT_NOT_FOUND: u8 = 127;

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
    /// The admin token (global or the team's), when the proxy has one: the preflight and
    /// the verdict read the admin API.
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

/// The signals a CI runner sends to stop a job: passed on to the command, whose end
/// (128 + the signal) is then the run's.
const FORWARDED_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Entry point of `loopwarden run`.
pub fn main(args: RunArgs) -> ExitCode {
    let verdict = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    match verdict {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("loopwarden run: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<u8> {
    let id = match args.id {
        Some(id) if valid_id(&id) => id,
        Some(id) => anyhow::bail!("--id {id:?}: use letters, digits and -_.:@+= (at most 128)"),
        None => format!("run-{:016x}", fastrand::u64(..)),
    };
    let Some((program, rest)) = args.command.split_first() else {
        anyhow::bail!("no command to run (loopwarden run -- COMMAND)");
    };
    let team = args
        .team
        .as_deref()
        .map(|t| crate::names::team_name(t.into()).into_owned());
    let admin = Admin::new(&args.proxy, args.admin_token.as_deref())?;
    admin
        .preflight(team.as_deref())
        .await
        .map_err(|e| e.context("preflight failed; the command was not started"))?;

    let base = match &team {
        Some(team) => format!(
            "{}/t/{}/c/{id}",
            admin.proxy,
            percent_encoding::utf8_percent_encode(team, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => format!("{}/c/{id}", admin.proxy),
    };
    let mut command = tokio::process::Command::new(program);
    if codex::is_codex(program) {
        command.args(codex::overrides(&base, rest, codex::home().as_deref()));
    }
    command.args(rest).env(codex::CONVERSATION_VARIABLE, &id);
    match &team {
        Some(team) => command.env(codex::TEAM_VARIABLE, team),
        // Not a team of an enclosing run's.
        None => command.env_remove(codex::TEAM_VARIABLE),
    };
    for (variable, path) in BASE_URL_VARIABLES {
        command.env(variable, format!("{base}{path}"));
    }

    let ended = match run_command(command).await {
        Ok(ended) => ended,
        Err(e) => {
            let (code, what) = match e.kind() {
                std::io::ErrorKind::NotFound => (EXIT_NOT_FOUND, "command not found"),
                std::io::ErrorKind::PermissionDenied => (EXIT_NOT_EXECUTABLE, "cannot run it"),
                _ => (EXIT_NOT_EXECUTABLE, "cannot start it"),
            };
            eprintln!("loopwarden run: {program}: {what} ({e})");
            return Ok(code);
        }
    };
    verdict(&admin, &id, ended).await
}

/// How the command ended.
#[derive(Debug, Clone, Copy)]
enum Ended {
    Exited(u8),
    Signalled(libc::c_int),
}

/// Runs `command` to its end; a stop signal `run` receives meanwhile goes to it.
async fn run_command(mut command: tokio::process::Command) -> std::io::Result<Ended> {
    use std::os::unix::process::ExitStatusExt;
    use tokio::signal::unix::{signal, SignalKind};

    let mut child = command.spawn()?;
    let mut streams = Vec::new();
    for number in FORWARDED_SIGNALS {
        streams.push((number, signal(SignalKind::from_raw(number))?));
    }
    let received = async {
        let waits = streams
            .iter_mut()
            .map(|(number, stream)| Box::pin(async move { stream.recv().await.map(|_| *number) }));
        futures_util::future::select_all(waits).await.0
    };
    tokio::pin!(received);
    let status = tokio::select! {
        status = child.wait() => status?,
        Some(number) = &mut received => {
            if let Some(pid) = child.id() {
                forward(pid, number);
            }
            // One signal passed on; the command's end is what counts from here.
            child.wait().await?
        }
    };
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => Ended::Exited(code.clamp(0, 255) as u8),
        (None, Some(signal)) => Ended::Signalled(signal),
        (None, None) => Ended::Exited(EXIT_ERROR),
    })
}

/// Sends signal `number` to process `pid` (the command `run` started).
#[allow(unsafe_code, reason = "kill(2) is a C call")]
fn forward(pid: u32, number: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid, number);
    }
}

/// The run's exit status, from how the command ended and what the proxy says of the run.
async fn verdict(admin: &Admin, id: &str, ended: Ended) -> anyhow::Result<u8> {
    let state = match ended {
        Ended::Exited(_) => admin.state(id, STATE_WAIT).await?,
        // Killed: one look, no waiting (the kill is the news); a proxy that cannot be
        // asked leaves the shell's answer.
        Ended::Signalled(_) => admin
            .state(id, Duration::ZERO)
            .await
            .unwrap_or(State::NotSeen),
    };
    if let State::Halted = state {
        eprintln!(
            "loopwarden run: loopwarden halted this run (conversation {id}); exit status {EXIT_HALTED}"
        );
        return Ok(EXIT_HALTED);
    }
    let own = match ended {
        Ended::Exited(code) => code,
        Ended::Signalled(signal) => {
            let code = u8::try_from(128 + signal).unwrap_or(u8::MAX);
            eprintln!(
                "loopwarden run: the command was killed by signal {signal}; exit status {code}"
            );
            return Ok(code);
        }
    };
    match state {
        State::NotSeen => {
            eprintln!(
                "loopwarden run: the proxy saw no model request of this run (conversation {id}): \
                 does the command read one of {} (Codex: see the README)?",
                BASE_URL_VARIABLES.map(|(v, _)| v).join(", ")
            );
            Ok(if own == 0 { EXIT_UNSEEN } else { own })
        }
        State::Halted | State::Running => Ok(own),
    }
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

/// The proxy's health check and admin API, as `run` asks them.
struct Admin {
    /// The proxy's URL, without a trailing `/`.
    proxy: String,
    token: Option<String>,
    client: reqwest::Client,
}

/// The part of `GET /admin/api/policies` the preflight reads.
#[derive(serde::Deserialize)]
struct Policies {
    /// The token's team, for a team's token.
    #[serde(default)]
    team: Option<String>,
    policies: Vec<PolicyEntry>,
}

#[derive(serde::Deserialize)]
struct PolicyEntry {
    name: String,
    #[serde(rename = "match")]
    selector: crate::policy::Selector,
}

impl Admin {
    fn new(proxy: &str, token: Option<&str>) -> anyhow::Result<Admin> {
        Ok(Admin {
            proxy: proxy.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()).map(str::to_string),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        })
    }

    /// A GET of one of the proxy's own paths: its status and body.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, bytes::Bytes)> {
        let mut request = self.client.get(format!("{}{path}", self.proxy));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the proxy at {}: {e}", self.proxy))?;
        let status = answer.status().as_u16();
        Ok((status, answer.bytes().await?))
    }

    /// The checks before the command starts (the module's step 1).
    async fn preflight(&self, team: Option<&str>) -> anyhow::Result<()> {
        let (status, _) = self.get("/healthz").await?;
        if status != 200 {
            anyhow::bail!(
                "{}/healthz answered {status}: is loopwarden listening there (--proxy, LOOPWARDEN_URL)?",
                self.proxy
            );
        }
        let body = match self.get("/admin/api/policies").await? {
            (200, body) => body,
            (401, _) => anyhow::bail!(
                "the proxy refused the admin token (--admin-token, LOOPWARDEN_ADMIN_TOKEN): {}",
                if self.token.is_some() {
                    "it is not one of the proxy's tokens"
                } else {
                    "none was given, and the proxy has one"
                }
            ),
            (status, body) => anyhow::bail!(
                "the proxy's admin API answered {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ),
        };
        let listed: Policies = serde_json::from_slice(&body)
            .map_err(|e| anyhow::anyhow!("the proxy's policies could not be read: {e}"))?;
        match (listed.team.as_deref(), team) {
            (Some(own), Some(team)) if own != team => anyhow::bail!(
                "the admin token is team {own:?}'s, and --team is {team:?}"
            ),
            (Some(own), None) => anyhow::bail!(
                "the admin token is team {own:?}'s: run with --team {own} (its conversations are the ones it reads)"
            ),
            _ => {}
        }
        let Some(team) = team else {
            return Ok(());
        };
        if listed.policies.iter().any(|p| p.selector.names_team(team)) {
            return Ok(());
        }
        let mut named: Vec<&str> = listed
            .policies
            .iter()
            .flat_map(|p| p.selector.team.iter().map(String::as_str))
            .collect();
        named.sort_unstable();
        named.dedup();
        let known = if named.is_empty() {
            "no policy names a team".to_string()
        } else {
            format!("the policies name {}", named.join(", "))
        };
        let policies: Vec<&str> = listed.policies.iter().map(|p| p.name.as_str()).collect();
        anyhow::bail!(
            "no policy matches team {team:?} ({known}; policies: {}): its run would fall under the default policy",
            policies.join(", ")
        )
    }

    /// The run's conversation as the admin API has it, looked for up to `wait` while the
    /// proxy has not seen it yet.
    async fn state(&self, id: &str, wait: Duration) -> anyhow::Result<State> {
        let path = format!(
            "/admin/api/conversations/{}",
            percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
        );
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (status, body) = self.get(&path).await?;
            match status {
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
                    "the proxy's admin API answered {status} about the run: {}",
                    String::from_utf8_lossy(&body).trim()
                ),
            }
        }
    }
}
