//! The log's writer: one thread of its own that writes what the request path queued, one
//! batch (one transaction) per wake-up, through its backend's batch writer
//! (`super::sqlite::write` for SQLite).
//!
//! Why a thread and not a tokio task over sqlx: every sqlx statement is a round trip to
//! sqlx's connection thread (two context switches per row, a few rows per request), which at
//! small request sizes cost more CPU than the whole request path. Here the request path
//! pushes onto a mutex-guarded queue and wakes the writer only when it sleeps with nothing to
//! do; the writer then gathers for a batch window and writes everything at once. Entries
//! that need work before they become rows (a finished request: decode the response, hash
//! and summarize tool calls) are worked out here too, off the request path.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Counters, Record};

/// A log entry whose rows are worked out on the writer thread.
pub trait Deferred: Send {
    /// Appends the entry's rows to `out`.
    fn records(self: Box<Self>, out: &mut Vec<Record>);
}

/// What the queue holds.
pub(super) enum Entry {
    Record(Record),
    Deferred(Box<dyn Deferred>),
}

/// The queue between the request path and the writer thread.
pub(super) struct Queue {
    state: Mutex<State>,
    /// Wakes the writer: first entry after idling, a full batch, a flush, closing.
    wake: Condvar,
    pub(super) counters: Counters,
    capacity: usize,
    batch_size: usize,
    window: Duration,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// Answered once every entry queued before them is written.
    flushes: Vec<oneshot::Sender<()>>,
    /// The writer sleeps until something arrives (only then does a push wake it).
    idle: bool,
    /// No more entries will come (every `Store` is gone, or the writer died).
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an entry; `false` when the queue is full (or closed): the entry is dropped.
    pub(super) fn push(&self, entry: Entry) -> bool {
        let mut s = self.lock();
        if s.closed || s.entries.len() >= self.capacity {
            return false;
        }
        s.entries.push(entry);
        // While the writer gathers, pushes do not wake it (that is the point), except to
        // say a batch is full.
        let wake = s.idle || s.entries.len() == self.batch_size;
        s.idle = false;
        drop(s);
        if wake {
            self.wake.notify_one();
        }
        true
    }

    /// Asks for `done` to be answered once everything queued so far is written.
    /// `false` when the writer is gone.
    pub(super) fn flush(&self, done: oneshot::Sender<()>) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        s.flushes.push(done);
        s.idle = false;
        drop(s);
        self.wake.notify_one();
        true
    }

    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Waits for work, gathers for the window, and moves the next batch into `batch`.
    /// Returns the flushes this batch completes, and whether the writer should stop after it.
    fn next_batch(&self, batch: &mut Vec<Entry>) -> (Vec<oneshot::Sender<()>>, bool) {
        let mut s = self.lock();
        while s.entries.is_empty() && s.flushes.is_empty() && !s.closed {
            s.idle = true;
            s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.idle = false;
        let deadline = Instant::now() + self.window;
        while s.flushes.is_empty() && !s.closed && s.entries.len() < self.batch_size {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = self
                .wake
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let n = s.entries.len().min(self.batch_size);
        batch.extend(s.entries.drain(..n));
        let flushes = if s.entries.is_empty() {
            std::mem::take(&mut s.flushes)
        } else {
            Vec::new()
        };
        (flushes, s.closed && s.entries.is_empty())
    }
}

/// Handle whose drop (the last `Store` going away) lets the writer finish and stop.
pub(super) struct Handle {
    pub(super) queue: Arc<Queue>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// Starts the writer thread: `main` runs on it with the queue, and writes its batches by
/// calling [`run`] with its backend's batch writer (which it owns: a connection and the
/// statements prepared on it live as long as the thread).
pub(super) fn start(
    capacity: usize,
    batch_size: usize,
    window: Duration,
    main: impl FnOnce(&Queue) + Send + 'static,
) -> anyhow::Result<Handle> {
    let queue = Arc::new(Queue {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        counters: Counters::default(),
        capacity: capacity.max(1),
        batch_size: batch_size.max(1),
        window,
    });
    let writer_queue = queue.clone();
    crate::spawn::thread("loopwarden-log".into(), move || main(&writer_queue))?;
    Ok(Handle { queue })
}

/// A backend's batch writer: writes a batch's records in one transaction.
pub(super) type WriteBatch<'w> = dyn FnMut(&[Record]) -> anyhow::Result<()> + 'w;

/// The writer thread: batch after batch until the queue closes, each batch's records
/// written by `write`.
pub(super) fn run(queue: &Queue, write: &mut WriteBatch<'_>) {
    // If this thread ever dies, nobody may wait for it: close the queue and drop the
    // pending flushes (their waiters return).
    struct Dead<'a>(&'a Queue);
    impl Drop for Dead<'_> {
        fn drop(&mut self) {
            let mut s = self.0.lock();
            s.closed = true;
            s.flushes.clear();
        }
    }
    let _dead = Dead(queue);
    let counters = &queue.counters;
    let mut batch = Vec::new();
    let mut records = Vec::new();
    loop {
        let (flushes, last) = queue.next_batch(&mut batch);
        for entry in batch.drain(..) {
            match entry {
                Entry::Record(r) => records.push(r),
                Entry::Deferred(d) => {
                    // A bug in decoding one response must not end the log.
                    if catch_unwind(AssertUnwindSafe(|| d.records(&mut records))).is_err() {
                        counters.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if !records.is_empty() {
            let n = records.len() as u64;
            match write(&records) {
                Ok(()) => {
                    counters.written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    counters.failed.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(records = n, error = %e, "log write failed: records lost");
                }
            }
            records.clear();
        }
        for done in flushes {
            let _ = done.send(());
        }
        if last {
            return;
        }
    }
}
