//! Detection across a compaction: a conversation that continues a run from a summary folds
//! its steps on top of the run's fold up to the summary request (`Engine::decide_carried`),
//! so the escalation reached goes on, the step count goes on, and the first re-read of a
//! file whose content the summary replaced is needed work, not a repeat.

use std::sync::Arc;

use loopwarden::detect::{Action, Engine, EngineState, StoreFacts};
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use serde_json::json;

fn read(path: &str, content: &str) -> CallWithResult {
    CallWithResult {
        call: ToolCall {
            id: String::new(),
            name: "read_file".into(),
            args: json!({ "path": path }),
        },
        result: Some(ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: content.into(),
            is_error: None,
        }),
    }
}

fn transcript(task: &str, reads: usize) -> Transcript {
    Transcript {
        system: vec!["You are an agent.".into()],
        task: vec![task.into()],
        steps: (0..reads)
            .map(|index| Step {
                index,
                text: String::new(),
                calls: vec![read("calc.py", "def add(a, b):\n    return a - b\n")],
                user_after: vec![],
            })
            .collect(),
    }
}

/// Each request of a conversation in turn (request k carries its first k steps), decided
/// as the proxy does: the cached fold continued, on top of `carry` when given. Returns the
/// actions and the fold after the last request.
fn requests(
    engine: &Engine,
    whole: &Transcript,
    carry: Option<&EngineState>,
) -> (Vec<Action>, Arc<EngineState>) {
    let store = StoreFacts::default();
    let mut cache = None;
    let mut actions = Vec::new();
    for k in 0..=whole.steps.len() {
        let mut t = whole.clone();
        t.steps.truncate(k);
        let (decision, state, _) = engine.decide_carried(&t, &store, cache, None, None, carry);
        actions.push(decision.action);
        cache = Some(state);
    }
    (actions, cache.unwrap())
}

#[test]
fn a_loop_that_goes_on_after_a_compaction_goes_on_being_escalated() {
    let engine = Engine::default();
    // Before the compaction: read four times, nudged.
    let (before, fold) = requests(&engine, &transcript("Fix the failing test.", 4), None);
    assert!(before.contains(&Action::Nudge), "{before:?}");
    // After it, the history is a summary; the run reads the file again and again.
    let after = transcript(
        "This session is being continued: read calc.py, no edit yet.",
        4,
    );
    let (carried, state) = requests(&engine, &after, Some(&fold));
    // The first re-read is needed work: observed. The next is a repeat of a loop the run
    // was already nudged about: the ladder goes on past the nudge, it does not start over.
    assert_eq!(carried[1], Action::Observe, "{carried:?}");
    assert!(
        carried[2..].iter().any(|a| *a > Action::Nudge),
        "escalated past the nudge: {carried:?}"
    );
    // The steps go on: the run's, not the transcript's.
    assert_eq!(state.steps(), 8);
    // Without the carry, the same conversation starts over: observes, then nudges at best.
    let (fresh, fresh_state) = requests(&engine, &after, None);
    assert!(fresh.iter().all(|a| *a <= Action::Nudge), "{fresh:?}");
    assert_eq!(fresh_state.steps(), 4);
}

/// The ladder goes on where it stood: after the one re-read the compaction made needed,
/// the very next repeat of the loop the run was nudged about gets the next rung (a needed
/// re-read is no progress that would start the loop's count over).
#[test]
fn the_first_repeat_after_the_needed_re_read_gets_the_next_rung() {
    let engine = Engine::default();
    let (before, fold) = requests(&engine, &transcript("Fix the failing test.", 4), None);
    let nudged = before.iter().position(|a| *a == Action::Nudge);
    assert!(nudged.is_some(), "{before:?}");
    let after = transcript("This session is being continued: read calc.py.", 3);
    let (carried, _) = requests(&engine, &after, Some(&fold));
    assert_eq!(
        carried[1],
        Action::Observe,
        "the needed re-read: {carried:?}"
    );
    assert!(carried[2] > Action::Nudge, "the next repeat: {carried:?}");
}

#[test]
fn the_carried_decision_is_a_function_of_the_carry_and_the_transcript() {
    let engine = Engine::default();
    let (_, fold) = requests(&engine, &transcript("Fix the failing test.", 4), None);
    let after = transcript("This session is being continued.", 3);
    // Decided request by request with a cache, or at once with none: the same.
    let (stepwise, state) = requests(&engine, &after, Some(&fold));
    let (once, at_once, _) = engine.decide_carried(
        &after,
        &StoreFacts::default(),
        None,
        None,
        None,
        Some(&fold),
    );
    assert_eq!(Some(&once.action), stepwise.last());
    assert_eq!(at_once.steps(), state.steps());
    // A cache made without the carry is not continued with it, nor the reverse.
    let (_, plain, _) =
        engine.decide_carried(&after, &StoreFacts::default(), None, None, None, None);
    let (again, moved, _) = engine.decide_carried(
        &after,
        &StoreFacts::default(),
        Some(plain),
        None,
        None,
        Some(&fold),
    );
    assert_eq!(again.action, once.action);
    assert_eq!(moved.steps(), 7);
}

/// What `loopwarden replay --db` sees of a run: its steps in one transcript (the log
/// numbers them on across the compaction) and the step count its summary request carried.
/// Folded with the carry at that count, they give the decisions the proxy made request by
/// request, before the compaction and after it.
#[test]
fn the_logged_run_replays_to_the_decisions_the_proxy_made() {
    let engine = Engine::default();
    let before = transcript("Fix the failing test.", 4);
    let (first, fold) = requests(&engine, &before, None);
    let after = transcript("This session is being continued.", 5);
    let (second, _) = requests(&engine, &after, Some(&fold));
    let mut run = before.clone();
    run.steps.extend(after.steps.iter().cloned());
    for (i, s) in run.steps.iter_mut().enumerate() {
        s.index = i;
    }
    let replayed: Vec<Action> = engine
        .decisions_across(&run, &StoreFacts::default(), &[4])
        .into_iter()
        .map(|(_, d)| d.action)
        .collect();
    let mut proxied = first.clone();
    proxied.extend(&second[1..]);
    assert_eq!(replayed, proxied);
    // Without the compaction, the same steps decide otherwise: the re-read after the
    // summary would be a repeat.
    let plain: Vec<Action> = engine
        .decisions(&run, &StoreFacts::default())
        .into_iter()
        .map(|(_, d)| d.action)
        .collect();
    assert_ne!(plain, proxied);
}

/// A run's fold kept in the store (a continuation served by another process, or after a
/// restart) and read back carries the run as the fold itself does: the same decisions,
/// the same step count, the escalation reached.
#[test]
fn a_fold_read_back_from_the_store_carries_the_run_as_the_fold_does() {
    let engine = Engine::default();
    let (before, fold) = requests(&engine, &transcript("Fix the failing test.", 4), None);
    assert!(before.contains(&Action::Nudge), "{before:?}");
    let stored = fold.to_stored();
    assert!(!stored.is_empty());
    let read = EngineState::from_stored(&stored).expect("a stored fold reads back");
    assert_eq!(read.steps(), fold.steps());
    let after = transcript("This session is being continued: read calc.py.", 4);
    let (in_process, state) = requests(&engine, &after, Some(&fold));
    let (from_store, read_state) = requests(&engine, &after, Some(&read));
    assert_eq!(from_store, in_process);
    assert!(
        from_store[2..].iter().any(|a| *a > Action::Nudge),
        "{from_store:?}"
    );
    assert_eq!(read_state.steps(), state.steps());
    // Bytes that are no fold read as none.
    assert!(EngineState::from_stored(b"not a fold").is_none());
}
