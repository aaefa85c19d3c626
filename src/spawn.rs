//! The one way loopwarden starts concurrent work: tasks on the runtime and threads of its
//! own. Each is named (the name is the task's tracing span, or the thread's name), so that a
//! log line or a stack dump says which piece of work it came from. Calling `tokio::spawn` or
//! `std::thread` directly elsewhere is a lint error (clippy.toml, `disallowed-methods`).
#![allow(
    clippy::disallowed_methods,
    reason = "the place the other modules start their work through"
)]

use std::future::Future;

use tracing::Instrument;

/// Runs `future` as a task of the current runtime, in a span named `what`.
pub fn task<F>(what: &'static str, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(future.instrument(tracing::debug_span!("task", what)))
}

/// Runs `work` on a thread of its own called `name`.
pub fn thread<T, W>(name: String, work: W) -> std::io::Result<std::thread::JoinHandle<T>>
where
    W: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new().name(name).spawn(work)
}
