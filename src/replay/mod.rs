//! `loopwarden replay`: the proxy's analysis over recorded conversations.
//!
//! Each input line is one run: `id` and `messages` in OpenAI Chat Completions format
//! (plus optional `agent`, `resolved` and `tools`). For each run, the requests the agent
//! sent (request k holds the messages before the k-th assistant message, and the run's
//! tool definitions) go through the proxy's own analysis ([`Analyser`], with its caches),
//! and each turn through the response-side check: what the proxy would have decided, and
//! one JSON line is printed per intervention. A run stops at its first halt, pause or
//! block, as the agent would have.
//!
//! With `--db` instead of a file, the conversations the proxy's log kept whole are
//! replayed with a candidate config beside the current one ([`log`]).

pub mod log;
pub mod rollout;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::actions::ToolCatalog;
use crate::config::CacheConfig;
use crate::detect::engine::working_forward;
use crate::detect::score::{self, ScoreModel};
use crate::detect::{Action, DetectConfig, Engine, Response, StoreFacts};
use crate::dialect::{Dialect, ResponseTurn};
use crate::interventions::ConversationState;
use crate::policy::{Policy, PolicySet};
use crate::proxy::forward::{Analyser, Arrival};
use crate::proxy::identity;
use crate::proxy::memory::{BodyComparison, Memory};
use crate::proxy::serve::route::{Route, Upstream};
use crate::request_bytes::RequestBytes;
use crate::transcript::{Item, Transcript};

/// Options of `loopwarden replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// JSONL file: one object per line with `id` and `messages` (OpenAI Chat format).
    #[arg(required_unless_present = "db", conflicts_with = "db")]
    pub file: Option<std::path::PathBuf>,
    /// Config file (TOML) whose `[detect]` table to use (with `--db`: the current config,
    /// its policies, modes and budgets too).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Replay the conversations of this log (`sqlite://PATH` or a path) whose content was
    /// logged (`[log] content = true`) with `--candidate`, and print what would change.
    #[arg(long, requires = "candidate")]
    pub db: Option<String>,
    /// With `--db`: the config file (TOML) to try, compared with `--config`'s (default:
    /// the built-in settings): each policy's detection, and what its mode and budget would
    /// have done with the logged requests.
    #[arg(long, requires = "db")]
    pub candidate: Option<std::path::PathBuf>,
    /// With `--db`: conversations with a step logged on or after this day (YYYY-MM-DD,
    /// UTC) or Unix millisecond.
    #[arg(long, requires = "db")]
    pub since: Option<String>,
    /// With `--db`: ... and on or before this day (or before this Unix millisecond).
    #[arg(long, requires = "db")]
    pub until: Option<String>,
    /// With `--db`: conversations with a request logged under this policy.
    #[arg(long, requires = "db")]
    pub policy: Option<String>,
    /// With `--db`: this conversation only.
    #[arg(long, requires = "db")]
    pub conversation: Option<String>,
    /// Also print harm and savings figures (needs `resolved` labels in the input).
    #[arg(long)]
    pub summary: bool,
    /// Decide with this calibrated score model (JSON, as `scripts/fit_score.py` writes it)
    /// instead of the config's decider: how leave-one-family-out scores a family with a
    /// model fitted without it.
    #[arg(long, conflicts_with = "db")]
    pub score_model: Option<std::path::PathBuf>,
    /// Print, for the run with this id (`*`: every run), what the engine saw at each step
    /// (to stderr).
    #[arg(long)]
    pub explain: Option<String>,
}

/// One recorded run.
#[derive(Deserialize)]
struct Run<'a> {
    id: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    resolved: Option<bool>,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    /// The tool definitions the run's requests carried (Chat Completions `tools`), if
    /// recorded: a tool no profile knows is read through them.
    #[serde(default)]
    tools: Option<serde_json::Value>,
}

impl Run<'_> {
    /// A fresh engine state for the run, reading its calls with its tool definitions.
    fn start(&self, engine: &Engine, transcript: &Transcript) -> crate::detect::EngineState {
        let mut state = engine.start(transcript);
        if let Some(tools) = &self.tools {
            state.use_tools(std::sync::Arc::new(ToolCatalog::from_definitions(tools)));
        }
        state
    }
}

/// One intervention, as printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intervention {
    pub id: String,
    pub step: usize,
    pub action: String,
    pub detector: String,
    pub reason: String,
}

/// What replay found in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub id: String,
    pub agent: String,
    pub resolved: Option<bool>,
    pub steps: usize,
    pub interventions: Vec<Intervention>,
}

impl RunResult {
    /// The step of the first halt, pause or block.
    pub fn stop_step(&self) -> Option<usize> {
        self.interventions
            .iter()
            .find(|i| matches!(i.action.as_str(), "halt" | "pause" | "block"))
            .map(|i| i.step)
    }

    fn nudged(&self) -> bool {
        let stop = self.stop_step();
        self.interventions.iter().any(|i| {
            matches!(i.action.as_str(), "nudge" | "replan" | "rollback")
                && stop.is_none_or(|s| i.step < s)
        })
    }
}

/// Reads the `[detect]` table of a config file, loaded and checked as `serve` loads it:
/// a misspelt key or detector name is an error here too, not a table silently ignored
/// while a candidate is tried.
pub fn load_config(path: &std::path::Path) -> anyhow::Result<DetectConfig> {
    let config =
        read_config(path).with_context(|| format!("reading [detect] of {}", path.display()))?;
    Ok(config.detect)
}

/// A config file as `serve` reads it (the environment included), less the secrets only a
/// server needs (`crate::config::Purpose::ReadOnly`): the file a team runs is the file it
/// replays.
fn read_config(path: &std::path::Path) -> anyhow::Result<crate::config::Config> {
    let loaded = crate::config::Config::load_for(
        Some(path),
        |var| std::env::var(var).ok(),
        crate::config::Purpose::ReadOnly,
    )?;
    Ok(loaded.config)
}

/// The analysis a replay runs its requests through: the proxy's, with its caches, under
/// one policy with the detection settings replayed.
pub struct Replayer {
    analyser: Analyser,
    policy: std::sync::Arc<Policy>,
}

impl Replayer {
    pub fn new(detect: DetectConfig) -> Replayer {
        Replayer {
            analyser: Analyser {
                memory: Memory::new(&CacheConfig {
                    idle_secs: 3600,
                    ..CacheConfig::default()
                }),
            },
            policy: std::sync::Arc::new(Policy::detecting(detect)),
        }
    }

    /// A replayer that decides with `model` ([`Engine::with_score_model`]).
    pub fn with_score_model(detect: DetectConfig, model: ScoreModel) -> Replayer {
        let mut policy = Policy::detecting(detect);
        policy.engine = policy.engine.clone().with_score_model(model);
        Replayer {
            policy: std::sync::Arc::new(policy),
            ..Replayer::new(DetectConfig::default())
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.policy.engine
    }
}

/// Replays one run (one JSONL line).
pub fn replay_line(replayer: &Replayer, line: &str) -> anyhow::Result<RunResult> {
    let run: Run = serde_json::from_str(line).context("not a run object with id and messages")?;
    let mut items: Vec<Item> = Vec::new();
    for raw in &run.messages {
        items.extend(Dialect::OpenAiChat.parse_message(raw.get()));
    }
    let full = Transcript::from_items(items);
    let steps = full.steps.len();
    let requests = Requests::of(&run)?;
    let mut out = Vec::new();
    for k in 0..steps {
        let Some(body) = requests.body(k) else {
            break;
        };
        let (decision, state) = requests.analyse(replayer, &body)?;
        if decision.action != Action::Observe {
            out.push(Intervention::of(&run.id, k, &decision));
            if decision.action.stops() {
                break;
            }
        }
        let step = &full.steps[k];
        let turn = ResponseTurn {
            text: step.text.clone(),
            calls: step.calls.iter().map(|c| c.call.clone()).collect(),
            ..ResponseTurn::default()
        };
        let r = replayer.engine().decide_response_with(&state, &turn);
        if r.action == Action::Block {
            out.push(Intervention::of(&run.id, k, &r));
            break;
        }
    }
    replayer.analyser.memory.forget(&requests.conversation.id);
    Ok(RunResult {
        id: run.id,
        agent: run.agent.unwrap_or_else(|| "?".to_string()),
        resolved: run.resolved,
        steps,
        interventions: out,
    })
}

/// The requests of a recorded run, as its agent sent them.
struct Requests<'a> {
    id: &'a str,
    messages: &'a [&'a RawValue],
    /// Where each assistant message is: request k holds the messages before the k-th.
    assistants: Vec<usize>,
    /// `"tools":[...],` when the run recorded its tool definitions.
    tools: String,
    route: Route<'a>,
    headers: http::HeaderMap,
    /// The run's id, as the proxy names a conversation with a `/c/{id}` path.
    conversation: identity::Identity,
}

impl<'a> Requests<'a> {
    fn of(run: &'a Run<'a>) -> anyhow::Result<Requests<'a>> {
        #[derive(Deserialize)]
        struct Role<'r> {
            #[serde(borrow, default)]
            role: Option<&'r str>,
        }
        let mut assistants = Vec::new();
        for (i, raw) in run.messages.iter().enumerate() {
            let role: Role = serde_json::from_str(raw.get()).context("a message")?;
            if role.role == Some("assistant") {
                assistants.push(i);
            }
        }
        let tools = match &run.tools {
            Some(tools) => format!(r#""tools":{tools},"#),
            None => String::new(),
        };
        let headers = http::HeaderMap::new();
        let conversation =
            identity::stated(&headers, Some(&run.id)).context("a run without an id")?;
        Ok(Requests {
            conversation,
            id: &run.id,
            messages: &run.messages,
            assistants,
            tools,
            route: Route {
                upstream: Upstream::OpenAi,
                path: "/v1/chat/completions",
                query: None,
                conversation: Some(&run.id),
                team: None,
                dialect: Some((Dialect::OpenAiChat, false)),
            },
            headers,
        })
    }

    /// The body of request k.
    fn body(&self, k: usize) -> Option<RequestBytes> {
        let end = *self.assistants.get(k)?;
        let mut body = String::with_capacity(64 + self.tools.len());
        body.push_str(r#"{"model":"replay","#);
        body.push_str(&self.tools);
        body.push_str(r#""messages":["#);
        for (i, m) in self.messages[..end].iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(m.get());
        }
        body.push_str("]}");
        Some(RequestBytes::from(bytes::Bytes::from(body)))
    }

    /// A request through the proxy's analysis, kept as the conversation's last: its
    /// decision and the engine's state after it.
    fn analyse(
        &self,
        replayer: &Replayer,
        body: &RequestBytes,
    ) -> anyhow::Result<(
        crate::detect::Decision,
        std::sync::Arc<crate::detect::EngineState>,
    )> {
        let analyser = &replayer.analyser;
        let earlier = BodyComparison::new(
            &analyser.memory,
            Some(Dialect::OpenAiChat),
            Some(&self.conversation.id),
        );
        let arrival = Arrival {
            route: &self.route,
            headers: &self.headers,
            body,
            stated: Some(self.conversation.clone()),
            team: None,
            earlier,
        };
        let analysis = analyser.analyse(
            arrival,
            |_| replayer.policy.clone(),
            |_, _, _, _| ConversationState::free(),
        );
        let Some(parsed) = analysis.parsed else {
            anyhow::bail!(
                "{}: a request was not read: {}",
                self.id,
                analysis.parse_error.unwrap_or_default()
            );
        };
        let state = parsed.state.clone();
        let (_, decision) = analyser.keep(parsed);
        Ok((decision, state))
    }
}

impl Intervention {
    fn of(id: &str, step: usize, d: &crate::detect::Decision) -> Intervention {
        Intervention {
            id: id.to_string(),
            step,
            action: d.action.as_str().to_string(),
            detector: d.detector.clone(),
            reason: d.reason.clone(),
        }
    }
}

/// The `--explain` argument that explains every run of the file.
pub const EXPLAIN_ALL: &str = "*";

/// Writes, step by step, what the engine saw in one run: each call's meaning, result,
/// the facts it changed, the findings and the decision for the next request.
pub fn explain_line(
    engine: &Engine,
    line: &str,
    id: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let run: Run = serde_json::from_str(line).context("not a run object with id and messages")?;
    if id != EXPLAIN_ALL && run.id != id {
        return Ok(());
    }
    writeln!(out, "# {}", run.id)?;
    writeln!(
        out,
        "## score features: {}",
        score::feature_names().collect::<Vec<_>>().join(",")
    )?;
    let mut items: Vec<Item> = Vec::new();
    for raw in &run.messages {
        items.extend(Dialect::OpenAiChat.parse_message(raw.get()));
    }
    let full = Transcript::from_items(items);
    let mut state = run.start(engine, &full);
    let mut facts = state.facts().clone();
    for step in &full.steps {
        let ev = facts.fold(step, &engine.config);
        for c in &ev.calls {
            writeln!(
                out,
                "{:>3} {:?} {} | check={:?} streak={} fail_run={} reads={} err={} new={} lines={}/{} changed={} rep={} resent={} restarts={} obstacle={} | {}",
                ev.index,
                c.action.kind,
                crate::detect::short(&c.action.key),
                c.action.check,
                c.check_streak,
                c.fail_run,
                c.reads_since_change,
                c.is_error,
                c.new_result,
                c.novel_lines,
                c.content_lines,
                c.changed,
                c.stretch_repeat,
                c.resent,
                c.restarts,
                obstacle_note(&c.obstacle),
                crate::detect::short(&c.result_line),
            )?;
        }
        writeln!(
            out,
            "    . step {}: changed={} new={} rejected={} quiet={} last_new_source={:?} fix_verified={} progress={} stall={}/{}",
            ev.index,
            ev.changed,
            ev.new_info,
            ev.rejected,
            facts.stretch.steps,
            facts.last_new_source,
            facts.fix_verified,
            ev.progress.as_str(),
            facts.obstacles.stall_steps,
            facts.obstacles.stall_recurrences,
        )?;
        engine.fold(&mut state, step, &StoreFacts::default());
        let d = state.decision();
        writeln!(out, "{}", score_note(engine, &state, &ev, &d.findings))?;
        for f in &d.findings {
            writeln!(
                out,
                "      finding {} {:.2}: {}",
                f.detector, f.confidence, f.summary
            )?;
        }
        if d.action != Action::Observe {
            writeln!(
                out,
                "  ==> request {}: {} ({})",
                ev.index + 1,
                d.action.as_str(),
                d.detector
            )?;
        }
    }
    Ok(())
}

/// A step's calibrated-score inputs, for `--explain` (what `scripts/fit_score.py` fits
/// on): the probability under the engine's model (`-` without one), whether the run works
/// forward (`engine::working_forward`: a score stop may wait), whether a human spoke, the
/// step only recalled what a compaction took (no decision), a finding spent a hard budget,
/// and the features in `## score features` order (shortest round-trip decimals).
fn score_note(
    engine: &Engine,
    state: &crate::detect::EngineState,
    ev: &crate::detect::StepEvents,
    findings: &[crate::detect::Finding],
) -> String {
    let x = score::features(state.facts(), ev, findings, state.chronic(), &engine.config);
    let p = engine
        .score_model()
        .map_or("-".to_string(), |m| m.probability(&x).to_string());
    let hard = findings
        .iter()
        .any(|f| f.hard && engine.config.policy(&f.detector).response >= Response::Ask);
    let values: Vec<String> = x.iter().map(|v| v.to_string()).collect();
    format!(
        "    score p={p} working={} human={} recalled={} hard={} x={}",
        u8::from(working_forward(state.facts(), &engine.config)),
        u8::from(ev.human_spoke),
        u8::from(ev.recalled),
        u8::from(hard),
        values.join(",")
    )
}

/// A call's meeting with an obstacle, for `--explain`: `-` (none), `met#N/S` (the N-th call
/// to meet it, and the S-th step to meet it since anything got past it), `cleared` (its
/// command got past the obstacle its last run met).
fn obstacle_note(m: &crate::detect::obstacles::Meeting) -> String {
    match (m.obstacle, m.cleared) {
        (_, true) => "cleared".to_string(),
        (0, false) => "-".to_string(),
        (_, false) => format!("met#{}/{}", m.times, m.standing),
    }
}

/// Harm and savings figures over a group of runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    pub runs: usize,
    pub resolved: usize,
    pub unresolved: usize,
    /// Share of resolved runs halted (they would have succeeded).
    pub resolved_halted: f64,
    /// Share of resolved runs nudged before any halt.
    pub resolved_nudged: f64,
    /// Share of unresolved runs halted.
    pub unresolved_halted: f64,
    /// Over unresolved runs: sum of (N - k) for a halt at k, over the sum of N.
    pub steps_saved: f64,
}

pub fn figures<'a>(runs: impl IntoIterator<Item = &'a RunResult>) -> Figures {
    let mut f = Figures::default();
    let (mut res_halt, mut res_nudge, mut unres_halt) = (0usize, 0usize, 0usize);
    let (mut saved, mut total) = (0usize, 0usize);
    for r in runs {
        f.runs += 1;
        match r.resolved {
            Some(true) => {
                f.resolved += 1;
                res_halt += usize::from(r.stop_step().is_some());
                res_nudge += usize::from(r.nudged());
            }
            Some(false) => {
                f.unresolved += 1;
                total += r.steps;
                if let Some(k) = r.stop_step() {
                    unres_halt += 1;
                    saved += r.steps.saturating_sub(k);
                }
            }
            None => {}
        }
    }
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    f.resolved_halted = ratio(res_halt, f.resolved);
    f.resolved_nudged = ratio(res_nudge, f.resolved);
    f.unresolved_halted = ratio(unres_halt, f.unresolved);
    f.steps_saved = ratio(saved, total);
    f
}

fn print_figures(out: &mut impl Write, results: &[RunResult]) -> std::io::Result<()> {
    let mut groups: BTreeMap<&str, Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        groups.entry(r.agent.as_str()).or_default().push(r);
    }
    writeln!(
        out,
        "{:<16} {:>5} {:>5} {:>6} {:>10} {:>10} {:>12} {:>11}",
        "group", "runs", "res", "unres", "res-halted", "res-nudged", "unres-halted", "steps-saved"
    )?;
    let mut rows: Vec<(&str, Figures)> = vec![("all", figures(results.iter()))];
    rows.extend(groups.into_iter().map(|(a, rs)| (a, figures(rs))));
    for (name, f) in rows {
        writeln!(
            out,
            "{:<16} {:>5} {:>5} {:>6} {:>9.1}% {:>9.1}% {:>11.1}% {:>10.1}%",
            name,
            f.runs,
            f.resolved,
            f.unresolved,
            100.0 * f.resolved_halted,
            100.0 * f.resolved_nudged,
            100.0 * f.unresolved_halted,
            100.0 * f.steps_saved
        )?;
    }
    Ok(())
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(p) => load_config(p)?,
        None => DetectConfig::default(),
    };
    if let Some(db) = &args.db {
        return run_log(&args, db);
    }
    let Some(path) = &args.file else {
        anyhow::bail!("replay needs a JSONL file or --db");
    };
    let replayer = match &args.score_model {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let model = ScoreModel::from_json(&text)
                .with_context(|| format!("reading the score model {}", p.display()))?;
            Replayer::with_score_model(config, model)
        }
        None => Replayer::new(config),
    };
    let engine = replayer.engine();
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = std::io::BufReader::new(file);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut results = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(id) = &args.explain {
            if id == EXPLAIN_ALL || line.contains(id.as_str()) {
                explain_line(engine, &line, id, &mut std::io::stderr().lock())?;
            }
        }
        let result = replay_line(&replayer, &line)
            .with_context(|| format!("{}: line {}", path.display(), n + 1))?;
        for i in &result.interventions {
            serde_json::to_writer(&mut out, i)?;
            out.write_all(b"\n")?;
        }
        if args.summary {
            results.push(result);
        }
    }
    if args.summary {
        // Figures go to stderr so that stdout stays pure JSONL for scorers.
        let mut err = std::io::stderr().lock();
        print_figures(&mut err, &results)?;
    }
    out.flush()?;
    Ok(())
}

/// `replay --db`: the logged conversations with the current config (`--config`, else the
/// defaults) and the candidate. Each conversation is replayed under the policy each file
/// puts it under (its detection, mode, switches and budget), found by what the log kept of
/// its traffic (`crate::policy::PolicySet::select_logged`).
fn run_log(args: &ReplayArgs, db: &str) -> anyhow::Result<()> {
    let policies = |path: Option<&std::path::Path>| -> anyhow::Result<PolicySet> {
        let config = match path {
            Some(p) => read_config(p).with_context(|| format!("reading {}", p.display()))?,
            None => crate::config::Config::default(),
        };
        Ok(config.policy_set()?)
    };
    let Some(candidate) = &args.candidate else {
        anyhow::bail!("--db needs --candidate");
    };
    let current = policies(args.config.as_deref())?;
    let candidate = policies(Some(candidate))?;
    let resolve = |set: &PolicySet, logged: &crate::policy::Logged, name: &str| {
        set.select_logged(logged, name).clone()
    };
    let selection = log::Selection {
        since_ms: args
            .since
            .as_deref()
            .map(|t| log::parse_time(t, false))
            .transpose()
            .context("--since")?,
        until_ms: args
            .until
            .as_deref()
            .map(|t| log::parse_time(t, true))
            .transpose()
            .context("--until")?,
        policy: args.policy.clone(),
        conversation: args.conversation.clone(),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    log::replay(
        db,
        &selection,
        &|logged, name| resolve(&current, logged, name),
        &|logged, name| resolve(&candidate, logged, name),
        &mut out,
    )?;
    out.flush()?;
    Ok(())
}
