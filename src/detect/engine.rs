//! The engine: folds steps into facts, runs the detectors and turns findings into one
//! decision per request.
//!
//! The decision for request k comes from folding steps 0..k-1 (the history that request
//! carries), so the proxy and `loopwarden replay` agree by construction. Escalation is
//! part of that fold: an earlier nudge is a nudge the engine decided for an earlier request
//! of the same transcript, never something remembered outside it. The only outside inputs
//! are [`StoreFacts`]: an operator's resume and a human's dismissal of an alert.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::actions::{self, CallContext};
use crate::dialect::ResponseTurn;
use crate::transcript::{Step, Transcript};
use xxhash_rust::xxh3::xxh3_64;

use super::config::{Decider, DetectConfig, PatternPolicy, Response};
use super::facts::{Facts, StepEvents};
use super::score::{self, ScoreModel};
use super::{registry, verifier, Action, Decision, Detector, Finding};

/// Facts from the store that a transcript cannot hold. Request indexes count like steps:
/// request k is the one sent before assistant turn k.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreFacts {
    /// Requests at which an operator released a halted or paused conversation.
    pub resumed_at: Vec<usize>,
    /// Alerts a human dismissed: (request index, detector name).
    pub dismissed: Vec<(usize, String)>,
}

impl StoreFacts {
    /// A hash of the facts: a cached fold made with other facts is not continued (an
    /// operator's resume at request k changes the decisions from k on).
    pub fn fingerprint(&self) -> u64 {
        if self.resumed_at.is_empty() && self.dismissed.is_empty() {
            return 0;
        }
        let mut h = blake3::Hasher::new();
        for r in &self.resumed_at {
            h.update(&(*r as u64).to_le_bytes());
        }
        h.update(b"|");
        for (at, d) in &self.dismissed {
            h.update(&(*at as u64).to_le_bytes());
            h.update(d.as_bytes());
            h.update(b"\0");
        }
        let b = h.finalize();
        let b = b.as_bytes();
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

/// Smoothing and cooldown of one pattern.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct PatternState {
    ema: f64,
    /// The last request this pattern led an intervention at.
    last_led: Option<usize>,
    /// No intervention from this pattern before this request (after a dismissal).
    quiet_until: usize,
}

/// Where escalation stands since the last time a human spoke.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
enum Level {
    #[default]
    Quiet,
    Nudged,
    Replanned,
    Stopped,
}

/// A detector's name, as a fold keeps it. An alias so that serde's derive, which reads
/// field types by their spelling, does not take `Option<&'static str>` for a string
/// borrowed from the input (`stored_names` reads it back as the detector's own).
type DetectorName = &'static str;

/// The engine's state after folding a prefix of a conversation. Clone it and cache it per
/// conversation: [`Engine::advance`] continues from it with only the new steps, and starts
/// over (with the same result) when the transcript is not a continuation.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EngineState {
    facts: Facts,
    #[serde(with = "stored_names::patterns")]
    patterns: BTreeMap<&'static str, PatternState>,
    level: Level,
    last_intervention: Option<usize>,
    /// The pattern that led the last intervention since a human last spoke.
    #[serde(with = "stored_names::one")]
    last_lead: Option<DetectorName>,
    /// The request of the first intervention since a human last spoke: a run that stood on
    /// one obstacle from there on may be stopped ([`may_stop`]).
    first_intervention: Option<usize>,
    /// The decision for the next request (request number `facts.steps`).
    next: Option<Decision>,
    /// Action keys of the loop a halting pattern reported, until the world changes.
    loop_keys: Vec<u64>,
    #[serde(with = "stored_names::one")]
    loop_detector: Option<DetectorName>,
    /// That pattern is a run standing on an obstacle ([`Finding::standstill`]).
    loop_standstill: bool,
    /// A chain over the fingerprints of every folded step: what a transcript must hash to,
    /// over its first steps, to be continued from this fold without the caller's word.
    chain: u64,
    /// Task fingerprint (the first user message).
    task_fp: u64,
    /// Fingerprint of the store facts the fold used: other facts, other fold.
    store_fp: u64,
    /// The engine that made this fold ([`Engine::serial`]; 0: none yet).
    engine: u64,
    /// This fold's number, new each time [`Engine::advance`] moves it (0: never advanced),
    /// so that a caller can say which fold saw a transcript's steps ([`Folded`]).
    number: u64,
    /// Steps folded from the run's history before a compaction
    /// ([`Engine::decide_carried`]): in the facts, not in this transcript. 0 for a
    /// conversation that starts its run.
    carried: usize,
    /// The number of the fold carried over (0: none).
    carried_from: u64,
}

/// What a caller knows of a transcript: it extends (`Transcript::extend_items`) the one
/// that the fold numbered `fold` decided for, and its first `steps` steps are still the
/// ones that fold saw ([`EngineState::folded`] of that fold, with `steps` cut to what the
/// extension left untouched: [`Folded::within`]). Given to [`Engine::decide_shared`], it
/// stands in for the chain over every folded step, which a request would otherwise hash
/// (its whole history). It must be true: a fold continued on a false one decides from
/// steps the transcript no longer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Folded {
    pub fold: u64,
    pub steps: usize,
}

impl Folded {
    /// The same knowledge, for the transcript's first `untouched` steps only.
    pub fn within(self, untouched: usize) -> Folded {
        Folded {
            steps: self.steps.min(untouched),
            ..self
        }
    }
}

/// The last fold number handed out ([`EngineState::number`]).
static FOLDS: AtomicU64 = AtomicU64::new(0);
/// The last engine number handed out ([`Engine`]`::serial`).
static ENGINES: AtomicU64 = AtomicU64::new(0);

impl EngineState {
    /// Steps folded so far: the run's, those carried over a compaction included.
    pub fn steps(&self) -> usize {
        self.facts.steps
    }

    /// Whether the fold continues a run from a summary ([`Engine::decide_carried`]).
    pub fn is_carried(&self) -> bool {
        self.carried_from != 0
    }

    /// Steps folded from this transcript (not carried over a compaction).
    fn own_steps(&self) -> usize {
        self.facts.steps - self.carried
    }

    /// The state a conversation that continues a run after a compaction starts from: this
    /// fold (the run's, up to its summary request), with what the model no longer has in
    /// its context forgotten ([`Facts::after_compaction`]); its own steps fold on top. The
    /// escalation reached, the patterns' smoothing and the step count go on.
    fn carried_into(&self, transcript: &Transcript) -> EngineState {
        let mut state = self.clone();
        state.facts.after_compaction();
        state.carried = state.facts.steps;
        state.carried_from = self.number;
        state.chain = 0;
        state.task_fp = task_fingerprint(transcript.goal());
        state
    }

    /// The fold as the store keeps it (a run's state at its summary request, for a
    /// continuation served by another process: `crate::proxy::memory::lineage`): CBOR, whose
    /// maps take the facts' tuple keys as they are. The tool catalog is not kept (each
    /// request brings its tools).
    pub fn to_stored(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a Vec fails only on a value serde cannot express: none here.
        if let Err(e) = ciborium::into_writer(self, &mut out) {
            tracing::warn!(error = %e, "a fold could not be serialized: not stored");
            out.clear();
        }
        out
    }

    /// A fold read back from [`EngineState::to_stored`], numbered anew in this process (a
    /// fold number is one process's: another's could name a fold of this one); `None` when
    /// the bytes are no fold.
    pub fn from_stored(bytes: &[u8]) -> Option<EngineState> {
        let mut state: EngineState = ciborium::from_reader(bytes).ok()?;
        state.number = FOLDS.fetch_add(1, Ordering::Relaxed) + 1;
        Some(state)
    }

    /// Hash chain over the fingerprints of the folded steps: a cache key for the prefix.
    pub fn chain(&self) -> u64 {
        self.chain
    }

    /// Which fold this is and how many steps it folded: what to keep with the transcript
    /// it decided for, to give [`Engine::decide_shared`] with that transcript's extension.
    pub fn folded(&self) -> Folded {
        Folded {
            fold: self.number,
            steps: self.own_steps(),
        }
    }

    /// The decision for the request that carries exactly the folded steps.
    pub fn decision(&self) -> Decision {
        self.next.clone().unwrap_or_else(Decision::observe)
    }

    /// Whether [`Engine::decide_response_with`] could say `Block` for a response to the
    /// request that carries exactly the folded steps, so the proxy reads only those
    /// responses on the way back (the others stream through untouched).
    pub fn may_block(&self, config: &DetectConfig) -> bool {
        let Some(detector) = self.loop_detector else {
            return false;
        };
        self.level >= self.block_level(config)
            && self.level < Level::Stopped
            && !self.loop_keys.is_empty()
            && config.policy(detector).response == Response::Halt
    }

    /// The level a run must have reached for a response to be blocked: like a halt, a
    /// block comes after the whole ladder (a nudge, and a replan where there is one).
    fn block_level(&self, config: &DetectConfig) -> Level {
        if config.escalation.replan_step {
            Level::Replanned
        } else {
            Level::Nudged
        }
    }

    /// Reads the calls of the steps folded from now on with the tool definitions the
    /// conversation's requests carry (a tool no profile knows is read through them).
    pub fn use_tools(&mut self, tools: Arc<crate::actions::ToolCatalog>) {
        self.facts.tools = (!tools.is_empty()).then_some(tools);
    }

    /// The highest smoothed firing rate of any pattern (its EMA): how chronic the most
    /// persistent pattern is. A feature of the calibrated score.
    pub fn chronic(&self) -> f64 {
        self.patterns.values().map(|p| p.ema).fold(0.0, f64::max)
    }

    /// The folded facts (for inspection and custom detectors' tests).
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// Starts escalation over when a human spoke (not the scaffold) or an operator
    /// released the run at `request`, and forgets the loop to block once the world changed.
    fn start_over_if_released(&mut self, ev: &StepEvents, store: &StoreFacts, request: usize) {
        if ev.human_spoke || store.resumed_at.contains(&request) {
            self.level = Level::Quiet;
            self.last_intervention = None;
            self.last_lead = None;
            self.first_intervention = None;
            self.loop_keys.clear();
            self.loop_detector = None;
        }
        if ev.changed {
            self.loop_keys.clear();
            self.loop_detector = None;
        }
    }

    /// Records an intervention the pattern `lead` led at `request`: the level it reached
    /// (a level never goes down, short of a start over) and the pattern's cooldown.
    fn note_intervention(&mut self, action: Action, lead: &'static str, request: usize) {
        self.level = match action {
            Action::Halt | Action::Pause | Action::Block => Level::Stopped,
            Action::Replan => self.level.max(Level::Replanned),
            _ => self.level.max(Level::Nudged),
        };
        self.last_intervention = Some(request);
        self.first_intervention.get_or_insert(request);
        self.last_lead = Some(lead);
        if let Some(p) = self.patterns.get_mut(lead) {
            p.last_led = Some(request);
        }
    }
}

/// A step's fingerprint: its calls, results and texts. Equal fingerprints = same step.
/// Every folded step is fingerprinted once (`EngineState::chain`), and a request the
/// proxy cannot vouch for hashes its whole history with it (`continues`), so it must cost
/// little next to the request: xxh3 (several times blake3's speed on the short
/// inputs a step holds) over the arguments' values as they are, without writing them out
/// as JSON first (serde_json keeps object keys sorted, so key order cannot matter).
/// The fields are written into one buffer and hashed in one pass: fed to a streaming
/// hasher one small piece at a time they cost twice as much. A long field (a tool result of
/// a file read) goes to the streaming hasher as it is instead, after what the buffer holds:
/// copied into the buffer first, the two fingerprinted steps of a 209 KB request cost 45 k
/// instructions of copying on top of 27 k of hashing. Either way the same bytes are hashed
/// in the same order, so the value is the same. Fingerprints live in memory only (never
/// logged), so their values may change between versions.
pub fn step_fingerprint(step: &Step) -> u64 {
    fingerprint_split_at(step, LONG_FIELD)
}

/// The chain over step fingerprints one more step extends ([`EngineState::chain`]).
fn chain_step(chain: u64, fingerprint: u64) -> u64 {
    xxh3_64(&[chain.to_le_bytes(), fingerprint.to_le_bytes()].concat())
}

/// Fields at least this long are hashed where they lie rather than copied into the buffer.
const LONG_FIELD: usize = 4096;

/// [`step_fingerprint`], with fields of `long` bytes or more hashed where they lie.
fn fingerprint_split_at(step: &Step, long: usize) -> u64 {
    FINGERPRINT_INPUT.with_borrow_mut(|buffer| {
        buffer.clear();
        let mut input = Input {
            buffer,
            hasher: None,
            long,
        };
        input.field(b't', step.text.as_bytes());
        for c in &step.calls {
            input.field(b'c', c.call.name.as_bytes());
            input.json_value(&c.call.args);
            if let Some(r) = &c.result {
                input.field(b'r', r.text.as_bytes());
                input.buffer.push(r.is_error.map_or(2, u8::from));
            }
        }
        for u in &step.user_after {
            input.field(b'u', u.as_bytes());
        }
        let fp = match input.hasher.as_mut() {
            None => xxh3_64(input.buffer),
            Some(hasher) => {
                hasher.update(input.buffer);
                hasher.digest()
            }
        };
        if buffer.capacity() > FINGERPRINT_INPUT_KEPT {
            *buffer = Vec::new();
        }
        fp
    })
}

/// A serving thread keeps its fingerprint buffer up to this size between requests (a step
/// of a large conversation may hold a long tool result; that is not kept).
const FINGERPRINT_INPUT_KEPT: usize = 64 * 1024;

thread_local! {
    static FINGERPRINT_INPUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a fingerprint hashes: short pieces gathered in `buffer`, and once a long field
/// comes, a streaming hasher that takes the buffer so far and then the field itself.
struct Input<'a> {
    buffer: &'a mut Vec<u8>,
    hasher: Option<xxhash_rust::xxh3::Xxh3>,
    long: usize,
}

impl Input<'_> {
    /// A tagged, length-prefixed field: no two different steps give the same bytes.
    fn field(&mut self, tag: u8, bytes: &[u8]) {
        self.buffer.push(tag);
        self.buffer
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        if bytes.len() < self.long {
            self.buffer.extend_from_slice(bytes);
            return;
        }
        let hasher = self.hasher.get_or_insert_with(Default::default);
        hasher.update(self.buffer);
        self.buffer.clear();
        hasher.update(bytes);
    }

    fn json_value(&mut self, v: &serde_json::Value) {
        use serde_json::Value;
        match v {
            Value::Null => self.buffer.push(b'n'),
            Value::Bool(b) => self.buffer.extend_from_slice(&[b'b', u8::from(*b)]),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    self.field(b'#', &u.to_le_bytes());
                } else if let Some(i) = n.as_i64() {
                    self.field(b'-', &i.to_le_bytes());
                } else {
                    let f = n.as_f64().unwrap_or(f64::NAN);
                    self.field(b'.', &f.to_bits().to_le_bytes());
                }
            }
            Value::String(s) => self.field(b's', s.as_bytes()),
            Value::Array(a) => {
                self.field(b'[', &(a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| self.json_value(x));
            }
            Value::Object(m) => {
                self.field(b'{', &(m.len() as u64).to_le_bytes());
                for (k, x) in m {
                    self.field(b'k', k.as_bytes());
                    self.json_value(x);
                }
            }
        }
    }
}

/// The fingerprint of a conversation's task (its first user message), checked on every
/// request like the steps.
/// The detector names a stored fold holds (`&'static str` in memory), read back as the
/// registered detectors' own. A name no detector has any more reads as none: its pattern's
/// smoothing starts over, nothing else changes.
mod stored_names {
    use std::collections::BTreeMap;
    use std::sync::LazyLock;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{registry, PatternState};

    fn known(name: &str) -> Option<&'static str> {
        static NAMES: LazyLock<Vec<&'static str>> =
            LazyLock::new(|| registry::builtin().iter().map(|d| d.name()).collect());
        NAMES.iter().copied().find(|n| *n == name)
    }

    pub mod patterns {
        use super::*;

        pub fn serialize<S: Serializer>(
            map: &BTreeMap<&'static str, PatternState>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            map.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<BTreeMap<&'static str, PatternState>, D::Error> {
            let read = BTreeMap::<String, PatternState>::deserialize(d)?;
            Ok(read
                .into_iter()
                .filter_map(|(name, state)| Some((known(&name)?, state)))
                .collect())
        }
    }

    pub mod one {
        use super::*;

        pub fn serialize<S: Serializer>(
            name: &Option<&'static str>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            name.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<&'static str>, D::Error> {
            Ok(Option::<String>::deserialize(d)?.and_then(|name| known(&name)))
        }
    }
}

fn task_fingerprint(goal: &str) -> u64 {
    xxh3_64(goal.as_bytes())
}

/// Runs the detectors over a transcript and decides.
#[derive(Clone)]
pub struct Engine {
    pub config: DetectConfig,
    detectors: Arc<Vec<Box<dyn Detector>>>,
    /// The calibrated score, when `decider = "score"` ([`score`]).
    score: Option<Arc<ScoreModel>>,
    /// This engine's number, new for each engine made: a fold records the engine that made
    /// it, and another engine (another policy's settings, or the same policy reloaded)
    /// starts over rather than continue a fold its settings did not make.
    serial: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field(
                "detectors",
                &self.detectors.iter().map(|d| d.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(DetectConfig::default())
    }
}

impl Engine {
    pub fn new(config: DetectConfig) -> Engine {
        Engine::with_detectors(config, registry::builtin())
    }

    /// An engine with a custom detector set (the built-ins plus a user's own, say).
    pub fn with_detectors(config: DetectConfig, detectors: Vec<Box<dyn Detector>>) -> Engine {
        // The shipped model is checked by the tests; were it ever unreadable, the ladder
        // decides (and says so) rather than nothing.
        let score = (config.decider == Decider::Score)
            .then(|| match ScoreModel::shipped() {
                Ok(m) => Some(Arc::new(m)),
                Err(e) => {
                    tracing::error!(
                        "the shipped score model does not load ({e}): the ladder decides"
                    );
                    None
                }
            })
            .flatten();
        Engine {
            config,
            detectors: Arc::new(detectors),
            score,
            serial: ENGINES.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// This engine deciding with `model` instead of the shipped score (`loopwarden replay
    /// --score-model`: a model fitted without the runs replayed, to score them held out).
    pub fn with_score_model(mut self, model: ScoreModel) -> Engine {
        self.config.decider = Decider::Score;
        self.score = Some(Arc::new(model));
        self.serial = ENGINES.fetch_add(1, Ordering::Relaxed) + 1;
        self
    }

    /// The score model this engine decides with, if it decides by the score.
    pub fn score_model(&self) -> Option<&ScoreModel> {
        self.score.as_deref()
    }

    /// Names of the registered detectors.
    pub fn detector_names(&self) -> Vec<&'static str> {
        self.detectors.iter().map(|d| d.name()).collect()
    }

    /// The decision for the request that carries `transcript` (before it is forwarded).
    pub fn decide(&self, transcript: &Transcript) -> Decision {
        self.decide_with(transcript, &StoreFacts::default(), None).0
    }

    /// [`Engine::decide`] with store facts and a cached state; returns the new state to
    /// cache. The result does not depend on the cache.
    pub fn decide_with(
        &self,
        transcript: &Transcript,
        store: &StoreFacts,
        cache: Option<EngineState>,
    ) -> (Decision, EngineState) {
        let mut state = cache.unwrap_or_default();
        self.advance(&mut state, transcript, store);
        (state.decision(), state)
    }

    /// [`Engine::decide_with`] for a fold shared behind an `Arc` (the proxy's cached fold
    /// of a conversation). A request that carries exactly the folded steps (the same history
    /// again: a retry, or many clients sending one conversation) reads the shared fold and
    /// copies nothing; any other copies it (or takes it, when nobody else holds it) and
    /// advances. The decision is the same either way; the flag says whether the fold moved
    /// (and so is worth caching).
    ///
    /// `known`: what the caller knows of the transcript's steps ([`Folded`]), if anything.
    /// `tools`: the catalog of the request's tool definitions, which reads the calls of the
    /// steps folded from now on ([`EngineState::use_tools`]).
    pub fn decide_shared(
        &self,
        transcript: &Transcript,
        store: &StoreFacts,
        cache: Option<Arc<EngineState>>,
        known: Option<Folded>,
        tools: Option<&Arc<crate::actions::ToolCatalog>>,
    ) -> (Decision, Arc<EngineState>, bool) {
        self.decide_carried(transcript, store, cache, known, tools, None)
    }

    /// [`Engine::decide_shared`] for a transcript that continues a run after a
    /// compaction: `carry` is the run's fold up to its summary request, explicit input like
    /// the transcript (the proxy's lineage keeps it; a replay folds the run's earlier
    /// conversations to get it), so the decision stays a pure function of the two. The
    /// transcript's steps fold on top of it ([`EngineState::carried_into`]); `None` is
    /// [`Engine::decide_shared`].
    pub fn decide_carried(
        &self,
        transcript: &Transcript,
        store: &StoreFacts,
        cache: Option<Arc<EngineState>>,
        known: Option<Folded>,
        tools: Option<&Arc<crate::actions::ToolCatalog>>,
        carry: Option<&EngineState>,
    ) -> (Decision, Arc<EngineState>, bool) {
        match cache {
            Some(state)
                if state.own_steps() == transcript.steps.len()
                    && state.store_fp == store.fingerprint()
                    && self.continues(&state, transcript, known, carry) =>
            {
                (state.decision(), state, false)
            }
            cache => {
                let mut state = cache.map(Arc::unwrap_or_clone).unwrap_or_default();
                if let Some(tools) = tools {
                    state.use_tools(tools.clone());
                }
                self.advance_known(&mut state, transcript, store, known, carry);
                (state.decision(), Arc::new(state), true)
            }
        }
    }

    /// Brings `state` up to the end of `transcript`: folds only the steps after the ones
    /// it has, or starts over when the transcript does not continue what it folded (a
    /// compacted or different conversation).
    pub fn advance(&self, state: &mut EngineState, transcript: &Transcript, store: &StoreFacts) {
        self.advance_known(state, transcript, store, None, None);
    }

    /// [`Engine::advance`], with what the caller knows of the transcript's steps.
    fn advance_known(
        &self,
        state: &mut EngineState,
        transcript: &Transcript,
        store: &StoreFacts,
        known: Option<Folded>,
        carry: Option<&EngineState>,
    ) {
        let store_fp = store.fingerprint();
        if !self.continues(state, transcript, known, carry) || state.store_fp != store_fp {
            // The tool definitions belong to the requests, not to the folded steps.
            let tools = state.facts.tools.take();
            *state = match carry {
                Some(before) => EngineState {
                    engine: self.serial,
                    ..before.carried_into(transcript)
                },
                None => self.start(transcript),
            };
            state.store_fp = store_fp;
            if tools.is_some() {
                state.facts.tools = tools;
            }
        }
        let from = state.own_steps();
        for step in &transcript.steps[from..] {
            self.fold(state, step, store);
        }
        state.number = FOLDS.fetch_add(1, Ordering::Relaxed) + 1;
    }

    /// Whether `transcript` extends the steps folded into `state`: known from the caller
    /// (`known` names this fold and covers its steps), else checked on the task and the
    /// chain over every folded step. The check covers the whole prefix, so that no edit
    /// anywhere in a history is decided from a fold of what it used to be: detection stays
    /// a pure function of the transcript. It costs hashing the prefix, which the proxy
    /// avoids on a conversation's usual request by vouching for it.
    fn continues(
        &self,
        state: &EngineState,
        transcript: &Transcript,
        known: Option<Folded>,
        carry: Option<&EngineState>,
    ) -> bool {
        if state.engine != self.serial || state.carried_from != carry.map_or(0, |c| c.number) {
            return false;
        }
        let n = state.own_steps();
        if n == 0 {
            return state.task_fp == task_fingerprint(transcript.goal()) && state.next.is_some();
        }
        // An extension keeps the task once there are steps (later user messages go after
        // the last step), so the caller's word covers all that the check below looks at.
        if known.is_some_and(|k| {
            k.fold != 0 && k.fold == state.number && n <= k.steps && n <= transcript.steps.len()
        }) {
            return true;
        }
        transcript.steps.len() >= n
            && state.task_fp == task_fingerprint(transcript.goal())
            && transcript.steps[..n]
                .iter()
                .fold(0, |chain, step| chain_step(chain, step_fingerprint(step)))
                == state.chain
    }

    /// A fresh state for a conversation: nothing folded, observe.
    pub fn start(&self, transcript: &Transcript) -> EngineState {
        EngineState {
            facts: Facts::with_task(transcript.goal()),
            task_fp: task_fingerprint(transcript.goal()),
            next: Some(Decision::observe()),
            engine: self.serial,
            ..EngineState::default()
        }
    }

    /// Every request's decision over a whole transcript: (request index, decision) for
    /// each request 0..=steps. What `loopwarden replay` prints, and what the proxy would
    /// have decided request by request.
    pub fn decisions(&self, transcript: &Transcript, store: &StoreFacts) -> Vec<(usize, Decision)> {
        let mut state = self.start(transcript);
        let mut out = vec![(0, state.decision())];
        for step in &transcript.steps {
            self.fold(&mut state, step, store);
            out.push((state.facts.steps, state.decision()));
        }
        out
    }

    /// [`Engine::decisions`] over a run whose history the client compacted after each of
    /// the step counts in `compactions` (the log keeps them: its summary requests): the
    /// run's steps in one transcript, folded as the proxy folded them, with the run's fold
    /// carried across each compaction ([`Engine::decide_carried`]). What `loopwarden replay
    /// --db` replays a run with.
    pub fn decisions_across(
        &self,
        transcript: &Transcript,
        store: &StoreFacts,
        compactions: &[usize],
    ) -> Vec<(usize, Decision)> {
        let mut state = self.start(transcript);
        let mut out = vec![(0, state.decision())];
        for step in &transcript.steps {
            if compactions.contains(&state.facts.steps) {
                state = EngineState {
                    engine: self.serial,
                    ..state.carried_into(transcript)
                };
            }
            self.fold(&mut state, step, store);
            out.push((state.facts.steps, state.decision()));
        }
        out
    }

    /// Folds one step and decides for the request after it.
    pub fn fold(&self, state: &mut EngineState, step: &Step, store: &StoreFacts) {
        state.chain = chain_step(state.chain, step_fingerprint(step));
        if !self.config.enabled {
            state.facts.steps += 1;
            state.next = Some(Decision::observe());
            return;
        }
        let ev = state.facts.fold(step, &self.config);
        // A step that only brought back what a compaction took from the model is needed
        // work: nothing to find in it, and nothing the patterns' smoothing should count
        // as a quiet step (the ladder goes on from the next step where it stood).
        if ev.recalled && !ev.human_spoke {
            state.next = Some(Decision::observe());
            return;
        }
        let findings: Vec<Finding> = self
            .detectors
            .iter()
            .filter(|d| self.config.policy(d.name()).response != Response::Off)
            .filter_map(|d| d.check(&state.facts, &ev, &self.config))
            .collect();
        let decision = self.escalate(state, &ev, findings, store);
        state.next = Some(decision);
    }

    /// Findings → one decision for request `ev.index + 1`: EMA per pattern, cooldown,
    /// escalation ladder, and the rule that a halt needs an earlier nudge unless a hard
    /// budget is spent.
    fn escalate(
        &self,
        st: &mut EngineState,
        ev: &StepEvents,
        findings: Vec<Finding>,
        store: &StoreFacts,
    ) -> Decision {
        let request = ev.index + 1;
        self.smooth_patterns(st, ev, &findings, store, request);
        st.start_over_if_released(ev, store, request);
        if st.level == Level::Stopped {
            // A stopped run stays stopped until a human or an operator speaks.
            let mut d = st.decision();
            d.findings = findings;
            return d;
        }
        if ev.human_spoke || verifier::rising(&st.facts, ev) {
            // Real progress (or fresh instructions) outweighs any pattern this step.
            return observe(findings);
        }
        if let Some(hard) = self.hard_finding(&findings) {
            st.level = Level::Stopped;
            st.last_intervention = Some(request);
            let action = stop_action(self.config.policy(&hard.detector).response);
            return Decision {
                action,
                reason: hard.summary.clone(),
                detector: hard.detector.clone(),
                findings,
            };
        }
        if let Some(model) = self.score.as_deref() {
            return self.score_decision(st, ev, findings, model, request);
        }
        if ev.rejected && st.facts.fix_verified {
            // A turn the scaffold rejected (no tool call, a format error) in a run whose
            // code holds a fix a check has passed: the scaffold already answers the turn,
            // and the run is finishing. A reminder would be noise on top of the scaffold's.
            return observe(findings);
        }
        let Some((lead, lead_name, score)) = self.lead(st, &findings, request) else {
            return observe(findings);
        };
        let pol = self.config.policy(&lead.detector);
        if pol.response >= Response::Ask {
            // Remember the loop's calls so the response side can block its next repeat.
            st.loop_keys = lead.action_keys.clone();
            st.loop_detector = Some(lead_name);
            st.loop_standstill = lead.standstill;
        }
        let Some(action) = self.next_rung(st, lead_name, &pol, score, request) else {
            return observe(findings);
        };
        if action.stops()
            && !may_stop(
                &st.facts,
                &self.config,
                st.first_intervention,
                lead.standstill,
            )
        {
            // Still changing its code, or only fumbling the scaffold's format before it has
            // any fix: the stop waits (the pattern's next occasion asks again).
            return observe(findings);
        }
        st.note_intervention(action, lead_name, request);
        Decision {
            action,
            reason: lead.summary.clone(),
            detector: lead.detector.clone(),
            findings,
        }
    }

    /// The calibrated score's decision for `request` ([`score`]): a reminder when the
    /// step's probability reaches the nudge threshold (a first one, or another after the
    /// cooldown), a halt when it reaches the stop threshold after an earlier reminder and
    /// the escalation gap (and, if the model says so, not while the run works forward:
    /// [`working_forward`]).
    /// The lead shown is the weightiest finding, if any.
    fn score_decision(
        &self,
        st: &mut EngineState,
        ev: &StepEvents,
        findings: Vec<Finding>,
        model: &ScoreModel,
        request: usize,
    ) -> Decision {
        let x = score::features(&st.facts, ev, &findings, st.chronic(), &self.config);
        let p = model.probability(&x);
        let esc = &self.config.escalation;
        let waited = |gap: usize| st.last_intervention.is_none_or(|at| request >= at + gap);
        let action = if st.level >= Level::Nudged
            && p >= model.stop_at
            && waited(esc.escalation_gap)
            && !(model.stop_waits && working_forward(&st.facts, &self.config))
        {
            Action::Halt
        } else if p >= model.nudge_at && waited(esc.cooldown) {
            if st.level == Level::Quiet {
                Action::Nudge
            } else {
                Action::Replan
            }
        } else {
            return observe(findings);
        };
        let lead = findings.iter().max_by(|a, b| {
            a.confidence
                .partial_cmp(&b.confidence)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let (detector, reason) = match lead {
            Some(f) => (f.detector.clone(), f.summary.clone()),
            None => (
                SCORE_DETECTOR.to_string(),
                format!(
                    "no progress against the task for {} steps",
                    st.facts.stretch.steps.max(st.facts.obstacles.stall_steps)
                ),
            ),
        };
        st.note_intervention(action, SCORE_DETECTOR, request);
        Decision {
            action,
            reason,
            detector,
            findings,
        }
    }

    /// Updates each pattern's EMA with whether it fired this step (a pattern that neither
    /// fired nor applies keeps its EMA), and quiets the patterns a human dismissed an
    /// alert of at or before `request`.
    fn smooth_patterns(
        &self,
        st: &mut EngineState,
        ev: &StepEvents,
        findings: &[Finding],
        store: &StoreFacts,
        request: usize,
    ) {
        let esc = &self.config.escalation;
        for d in self.detectors.iter() {
            let fired = findings.iter().any(|f| f.detector == d.name());
            if !fired && !d.applies(ev) {
                continue;
            }
            let p = st.patterns.entry(d.name()).or_default();
            p.ema = esc.ema_alpha * f64::from(u8::from(fired)) + (1.0 - esc.ema_alpha) * p.ema;
        }
        for (at, detector) in &store.dismissed {
            if *at <= request {
                if let Some((_, p)) = st.patterns.iter_mut().find(|(n, _)| **n == detector) {
                    p.quiet_until = p.quiet_until.max(at + esc.dismiss_quiet);
                }
            }
        }
    }

    /// The first finding that spends a hard budget under a policy that may stop the run.
    fn hard_finding<'f>(&self, findings: &'f [Finding]) -> Option<&'f Finding> {
        findings
            .iter()
            .find(|f| f.hard && self.config.policy(&f.detector).response >= Response::Ask)
    }

    /// The finding that leads an intervention, with its detector's name and the score of
    /// all active findings (patterns allowed to act and not quieted by a dismissal): the
    /// weightiest one (the first among equals). None when no finding is active or the
    /// score does not reach the nudge score.
    fn lead<'f>(
        &self,
        st: &EngineState,
        findings: &'f [Finding],
        request: usize,
    ) -> Option<(&'f Finding, &'static str, f64)> {
        let weighted: Vec<(usize, f64)> = findings
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let pol = self.config.policy(&f.detector);
                let quiet = st
                    .patterns
                    .get(f.detector.as_str())
                    .is_some_and(|p| request < p.quiet_until);
                (pol.response >= Response::Nudge && !quiet)
                    .then_some((i, pol.weight * f.confidence))
            })
            .collect();
        let score: f64 = weighted.iter().map(|(_, w)| w).sum();
        let &(lead_i, _) = weighted.iter().max_by(|a, b| {
            a.1.partial_cmp(&b.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.0.cmp(&a.0))
        })?;
        if !reaches(score, self.config.escalation.nudge_score) {
            return None;
        }
        let lead = findings.get(lead_i)?;
        let lead_name = self
            .detectors
            .iter()
            .map(|d| d.name())
            .find(|n| *n == lead.detector)?;
        Some((lead, lead_name, score))
    }

    /// The ladder's next rung for the lead pattern, or none while it waits out the gap
    /// between escalations or its cooldown.
    fn next_rung(
        &self,
        st: &EngineState,
        lead_name: &'static str,
        pol: &PatternPolicy,
        score: f64,
        request: usize,
    ) -> Option<Action> {
        let esc = &self.config.escalation;
        if st.level == Level::Quiet {
            return Some(pol.first_action);
        }
        let ps = st.patterns.get(lead_name).copied().unwrap_or_default();
        let gap_ok = st
            .last_intervention
            .is_none_or(|at| request >= at + esc.escalation_gap);
        // Chronic: this pattern keeps firing (its EMA) with a score that warrants
        // more than a nudge, or a different pattern now confirms what an earlier
        // intervention reported and the agent did not act on: two independent
        // alerts, each past the nudge score. One detector firing again after its
        // cooldown is the same evidence once more, and stays a nudge.
        let corroborated = esc.corroborate && st.last_lead.is_some_and(|l| l != lead_name);
        let chronic = (ps.ema > esc.escalate_ema && reaches(score, esc.halt_score)) || corroborated;
        let cooled = ps.last_led.is_none_or(|at| request >= at + esc.cooldown);
        if chronic && gap_ok {
            match (st.level, pol.response) {
                (Level::Nudged, _) if esc.replan_step => Some(Action::Replan),
                (_, Response::Halt | Response::Ask) => Some(stop_action(pol.response)),
                _ if cooled => Some(Action::Replan),
                _ => None,
            }
        } else if cooled {
            Some(pol.first_action)
        } else {
            None
        }
    }

    /// The response-side check: `Block` when the response's new call would complete a loop
    /// that the policy halts on and that the agent was already nudged about; otherwise the
    /// request's own decision stands (observe when it was not a stop).
    pub fn decide_response(&self, transcript: &Transcript, turn: &ResponseTurn) -> Decision {
        let (_, state) = self.decide_with(transcript, &StoreFacts::default(), None);
        self.decide_response_with(&state, turn)
    }

    /// [`Engine::decide_response`] from a state already advanced to the transcript.
    pub fn decide_response_with(&self, state: &EngineState, turn: &ResponseTurn) -> Decision {
        let request = state.decision();
        if request.action.stops() {
            return request;
        }
        let Some(detector) = state.loop_detector else {
            return Decision::observe();
        };
        if state.level < state.block_level(&self.config) || state.loop_keys.is_empty() {
            return Decision::observe();
        }
        let pol = self.config.policy(detector);
        let chronic = state
            .patterns
            .get(detector)
            .is_some_and(|p| p.ema > self.config.escalation.escalate_ema);
        if pol.response != Response::Halt
            || !chronic
            || !may_stop(
                &state.facts,
                &self.config,
                state.first_intervention,
                state.loop_standstill,
            )
        {
            return Decision::observe();
        }
        let ctx = CallContext {
            open_file: state.facts.open_file.as_deref(),
            tools: state.facts.tools.as_deref(),
        };
        for call in &turn.calls {
            let a = actions::classify(call, &self.config.tools, &ctx);
            if state.loop_keys.contains(&a.key_hash) {
                let what = a.label();
                return Decision {
                    action: Action::Block,
                    findings: Vec::new(),
                    reason: format!(
                        // Says what the call is, not what is done about it: the
                        // `[intervene]` switches decide that (blocked, or held for a human).
                        "`{}` repeats the loop the agent was already warned about ({detector})",
                        super::short(&what)
                    ),
                    detector: detector.to_string(),
                };
            }
        }
        Decision::observe()
    }
}

/// The name a score decision goes by when no finding leads it.
pub const SCORE_DETECTOR: &str = "score";

/// Whether a drift score reaches a threshold. Confidences are sums of tenths
/// (0.7 + 0.1 = 0.7999999999999999 in binary): without the tolerance a threshold of 0.8
/// would silently mean "above 0.8".
fn reaches(score: f64, threshold: f64) -> bool {
    score + 1e-9 >= threshold
}

/// Whether the run may be stopped after its last folded step: the one rule for a halt or
/// pause on the request side and a block on the response side. A stop is the one decision
/// that can cost a success, so it waits while the run shows signs of working forward:
/// - it brought a source file to a new state within the last `quiet` steps: an agent whose
///   check prints the same thing while every edit is new is struggling, not stuck;
/// - the last step returned something the agent had never seen: it is learning;
/// - the last step is a turn the scaffold rejected (no tool call, a format error) and the
///   code holds no verified fix: the scaffold already tells the model what is wrong, and a
///   stop there keeps nothing. Once a check has passed on the changed code, a run that
///   keeps failing to call a tool is a fine place for a stop that keeps the tree.
///
/// Except a run that has stood on one obstacle since its first intervention (`since`, a
/// request index: the steps from there on): the last step met again an obstacle that stood
/// before the intervention, no command got past an obstacle since, and nothing changed the
/// world since. What it learned meanwhile did not get it past, and with no change since the
/// reminder there is no fix under way to lose (`escalation.stop_on_obstacle`). A pattern that is itself such a stand
/// (`standstill`) stops only there.
fn may_stop(facts: &Facts, config: &DetectConfig, since: Option<usize>, standstill: bool) -> bool {
    if facts.history.is_empty() {
        return true;
    }
    let index = facts.steps - 1;
    if !working_forward(facts, config) && !standstill {
        return true;
    }
    config.escalation.stop_on_obstacle
        && since.is_some_and(|since| {
            facts.obstacles.stood_since(since, index)
                && facts.last_change.is_none_or(|at| at < since)
        })
}

/// Whether the run shows, at its last folded step, a sign of working forward that holds a
/// stop ([`may_stop`]'s list): a source file brought to a new state within the last
/// `stop_after_quiet` steps, a result never seen, or a rejected turn before any verified fix.
pub fn working_forward(facts: &Facts, config: &DetectConfig) -> bool {
    let Some(last) = facts.history.last() else {
        return false;
    };
    let index = facts.steps - 1;
    let quiet = config.escalation.stop_after_quiet;
    let quiet_since_source = facts.last_new_source.is_none_or(|at| index >= at + quiet);
    !quiet_since_source || last.new_info || (last.rejected && !facts.fix_verified)
}

/// A decision that only reports `findings`.
fn observe(findings: Vec<Finding>) -> Decision {
    Decision {
        findings,
        ..Decision::observe()
    }
}

fn stop_action(response: Response) -> Action {
    match response {
        Response::Ask => Action::Pause,
        _ => Action::Halt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{CallWithResult, ToolCall, ToolResult};

    fn step(text: &str, args: serde_json::Value, result: &str, user: &str) -> Step {
        Step {
            index: 0,
            text: text.into(),
            calls: vec![CallWithResult {
                call: ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    args,
                },
                result: Some(ToolResult {
                    call_id: "c1".into(),
                    name: String::new(),
                    text: result.into(),
                    is_error: Some(false),
                }),
            }],
            user_after: vec![user.into()],
        }
    }

    /// Long fields hashed where they lie give the value the whole input copied into one
    /// buffer gives, wherever the long fields are.
    #[test]
    fn a_fingerprint_is_the_same_whether_long_fields_are_copied_or_not() {
        let long = "x\n".repeat(5000);
        let steps = [
            step("short", serde_json::json!({"path": "a.rs"}), "ok", "go on"),
            step(&long, serde_json::json!({"path": "a.rs"}), "ok", "go on"),
            step("t", serde_json::json!({"path": "a.rs"}), &long, "go on"),
            step("t", serde_json::json!({"content": long.clone()}), "ok", ""),
            step(&long, serde_json::json!({"n": 1}), &long, &long),
        ];
        let mut seen = std::collections::HashSet::new();
        for s in &steps {
            let copied = fingerprint_split_at(s, usize::MAX);
            assert_eq!(fingerprint_split_at(s, 0), copied);
            assert_eq!(fingerprint_split_at(s, 16), copied);
            assert_eq!(step_fingerprint(s), copied);
            seen.insert(copied);
        }
        assert_eq!(seen.len(), steps.len(), "different steps, different values");
    }
}
