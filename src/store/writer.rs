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
//!
//! A write that fails for a while (another process holds the database's lock, the disk is
//! full) keeps its records ([`Unwritten`]) and is tried again with backoff, together with
//! what arrived meanwhile, up to `store.retry_rows` records (past that the oldest are
//! dropped and counted). A write that would fail the same way again (a bad row, a table
//! gone) is counted and dropped at once. A database file deleted under the proxy ends the
//! loop so that its backend can make a new one ([`Stop::Reopen`]).
//!
//! Closing ([`Queue::close_by`]) sets a deadline: until then the writer keeps writing (and
//! retrying); what is still unwritten at the deadline, the queue's entries included, goes to
//! the spill file (`super::spill`), which the next start reads into the log. Records that
//! cannot be spilled either are counted as failed and their number logged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Counters, Record};

/// The first retry's wait; each failure doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How long the writer keeps retrying once the log closes without a deadline of its own (the
/// last `Store` dropped): then the records still unwritten are spilled.
const CLOSING_RETRY: Duration = Duration::from_secs(10);

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
    /// Records kept for a retry at most ([`Unwritten`]).
    retry_rows: usize,
    /// Where records unwritten at the closing deadline go (`super::spill`); unset, they
    /// are lost (counted as failed).
    pub(super) spill: OnceLock<PathBuf>,
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
    /// Set with `closed`: what is unwritten then is spilled.
    deadline: Option<Instant>,
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

    /// Entries the queue holds at most.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries waiting for the writer (the queue's depth).
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub(super) fn close(&self) {
        self.close_by(Instant::now() + CLOSING_RETRY);
    }

    /// No more entries will come; what is not written by `deadline` (or an earlier one
    /// already set) is spilled.
    pub(super) fn close_by(&self, deadline: Instant) {
        let mut s = self.lock();
        s.closed = true;
        s.deadline = Some(s.deadline.map_or(deadline, |d| d.min(deadline)));
        drop(s);
        self.wake.notify_one();
    }

    /// The closing deadline, once the queue is closed.
    fn deadline(&self) -> Option<Instant> {
        self.lock().deadline
    }

    /// Every entry still queued, and the flushes waiting for them (the closing deadline
    /// passed: they are spilled).
    fn take_all(&self) -> (Vec<Entry>, Vec<oneshot::Sender<()>>) {
        let mut s = self.lock();
        (
            std::mem::take(&mut s.entries),
            std::mem::take(&mut s.flushes),
        )
    }

    /// Waits for work (or until `due`), gathers for the window, and moves the next
    /// batch into `batch`. Returns the flushes this batch completes, and whether the queue
    /// is closed and empty (the writer stops once it has written what it holds).
    fn next_batch(
        &self,
        batch: &mut Vec<Entry>,
        due: Option<Instant>,
    ) -> (Vec<oneshot::Sender<()>>, bool) {
        let mut s = self.lock();
        while s.entries.is_empty() && s.flushes.is_empty() && !s.closed {
            s.idle = true;
            s = match due {
                None => self.wake.wait(s).unwrap_or_else(PoisonError::into_inner),
                Some(at) => {
                    let now = Instant::now();
                    if now >= at {
                        break;
                    }
                    let waited = self.wake.wait_timeout(s, at - now);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
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
    options: &super::StoreOptions,
    main: impl FnOnce(&Queue) + Send + 'static,
) -> anyhow::Result<Handle> {
    let queue = Arc::new(Queue {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        counters: Counters::default(),
        capacity: options.queue_capacity.max(1),
        batch_size: options.batch_size.max(1),
        window: options.batch_window,
        retry_rows: options.retry_rows.max(1),
        spill: OnceLock::new(),
    });
    let writer_queue = queue.clone();
    crate::spawn::thread("loopwarden-log".into(), move || {
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
        let _dead = Dead(&writer_queue);
        main(&writer_queue)
    })?;
    Ok(Handle { queue })
}

/// Why a batch was not written.
#[derive(Debug)]
pub(super) enum Failure {
    /// It may succeed later: the database is locked, full, or cannot be reached for now.
    /// The records are kept and tried again.
    Transient(anyhow::Error),
    /// It would fail the same way again (a bad row, a table gone): the records are lost.
    Permanent(anyhow::Error),
    /// The database file is gone or replaced: nothing was written; the backend must open
    /// a new one before anything else is.
    Reopen,
}

/// A backend's batch writer: writes a batch's records in one transaction.
pub(super) type WriteBatch<'w> = dyn FnMut(&[Record]) -> Result<(), Failure> + 'w;

/// Why [`run`] returned.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// The queue closed and everything was written (or given up on).
    Closed,
    /// The write said [`Failure::Reopen`]: the records are still in the [`Unwritten`].
    Reopen,
}

/// Records worked out and not written yet, with the flushes waiting for them; kept across
/// failed writes (and across [`run`]s, when the backend reopens).
#[derive(Default)]
pub(super) struct Unwritten {
    records: Vec<Record>,
    /// Answered once `records` are written, or given up on.
    flushes: Vec<oneshot::Sender<()>>,
    /// Failed attempts in a row.
    failures: u32,
    /// When the next attempt may be made, after a failure.
    retry_at: Option<Instant>,
}

impl Unwritten {
    /// Keeps at most `max` records, dropping the oldest (counted as failed).
    fn bound(&mut self, max: usize, counters: &Counters) {
        let over = self.records.len().saturating_sub(max);
        if over > 0 {
            self.records.drain(..over);
            let before = counters.failed.fetch_add(over as u64, Ordering::Relaxed);
            let total = before + over as u64;
            // Logged as the total passes each power of two, so a long outage does not flood
            // the log too.
            if total.ilog2() > before.max(1).ilog2() || before == 0 {
                tracing::warn!(
                    dropped = over,
                    failed_total = total,
                    "log records waiting for a retry exceed store.retry_rows: the oldest dropped"
                );
            }
        }
    }

    /// Gives up on the records (counted as failed).
    pub(super) fn give_up(&mut self, counters: &Counters) {
        counters
            .failed
            .fetch_add(self.records.len() as u64, Ordering::Relaxed);
        self.records.clear();
        self.failures = 0;
        self.retry_at = None;
    }

    /// The closing deadline passed: every record still unwritten, the queue's entries
    /// included, goes to the spill file (or, that failing too, is counted as lost), and
    /// the flushes waiting for them are answered.
    pub(super) fn spill_rest(&mut self, queue: &Queue) {
        let (entries, flushes) = queue.take_all();
        work_out(entries, &mut self.records, &queue.counters);
        self.flushes.extend(flushes);
        if !self.records.is_empty() {
            let n = self.records.len() as u64;
            let counters = &queue.counters;
            match queue.spill.get() {
                Some(path) => match super::spill::append(path, &self.records) {
                    Ok(()) => {
                        counters.spilled.fetch_add(n, Ordering::Relaxed);
                        tracing::warn!(records = n, path = %path.display(), "log records not written by the shutdown deadline: spilled, to be written at the next start");
                    }
                    Err(e) => {
                        counters.failed.fetch_add(n, Ordering::Relaxed);
                        tracing::error!(records_lost = n, path = %path.display(), error = %e, "log records not written by the shutdown deadline, and the spill file cannot be written: {n} records lost");
                    }
                },
                None => {
                    counters.failed.fetch_add(n, Ordering::Relaxed);
                    tracing::error!(
                        records_lost = n,
                        "log records not written by the shutdown deadline: {n} records lost"
                    );
                }
            }
            self.records.clear();
            self.failures = 0;
            self.retry_at = None;
        }
        self.answer_flushes_if_written();
    }

    fn answer_flushes_if_written(&mut self) {
        if self.records.is_empty() {
            for done in self.flushes.drain(..) {
                let _ = done.send(());
            }
        }
    }

    /// After a failure that keeps the records: when to try again.
    fn failed(&mut self, error: &anyhow::Error, counters: &Counters) {
        self.failures += 1;
        counters.retried.fetch_add(1, Ordering::Relaxed);
        if self.failures == 1 {
            tracing::warn!(records = self.records.len(), error = %error, "log write failed: keeping the records and retrying");
        } else {
            tracing::debug!(records = self.records.len(), attempts = self.failures, error = %error, "log write failed again");
        }
        let backoff = FIRST_BACKOFF.saturating_mul(1 << (self.failures - 1).min(16));
        self.retry_at = Some(Instant::now() + backoff.min(MAX_BACKOFF));
    }

    fn written(&mut self, counters: &Counters) {
        counters
            .written
            .fetch_add(self.records.len() as u64, Ordering::Relaxed);
        if self.failures > 0 {
            tracing::info!(
                records = self.records.len(),
                failed_attempts = self.failures,
                "log written after failed attempts: nothing lost"
            );
        }
        self.records.clear();
        self.failures = 0;
        self.retry_at = None;
    }
}

/// Turns queued entries into records (a deferred entry's are worked out here).
fn work_out(
    entries: impl IntoIterator<Item = Entry>,
    records: &mut Vec<Record>,
    counters: &Counters,
) {
    for entry in entries {
        match entry {
            Entry::Record(r) => records.push(r),
            Entry::Deferred(d) => {
                // A bug in decoding one response must not end the log.
                if catch_unwind(AssertUnwindSafe(|| d.records(records))).is_err() {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The writer thread: batch after batch until the queue closes, each batch's records (and
/// those of earlier failed batches) written by `write`.
pub(super) fn run(queue: &Queue, unwritten: &mut Unwritten, write: &mut WriteBatch<'_>) -> Stop {
    let counters = &queue.counters;
    let mut batch = Vec::new();
    loop {
        // Records held (after a failure, or across a reopen) are tried again when due, even
        // if nothing new comes.
        let due = (!unwritten.records.is_empty())
            .then(|| unwritten.retry_at.unwrap_or_else(Instant::now));
        let (flushes, closed) = queue.next_batch(&mut batch, due);
        work_out(batch.drain(..), &mut unwritten.records, counters);
        unwritten.flushes.extend(flushes);
        unwritten.bound(queue.retry_rows, counters);
        let deadline = queue.deadline();
        if deadline.is_some_and(|at| Instant::now() >= at) {
            unwritten.spill_rest(queue);
            return Stop::Closed;
        }
        if let Some(at) = unwritten.retry_at {
            let now = Instant::now();
            if now < at {
                if closed {
                    // Nothing more will wake the queue: wait here (until the deadline at
                    // most, when what is left is spilled).
                    let until = deadline.map_or(at, |d| d.min(at));
                    std::thread::sleep(until.saturating_duration_since(now));
                }
                continue;
            }
        }
        if !unwritten.records.is_empty() {
            match write(&unwritten.records) {
                Ok(()) => unwritten.written(counters),
                Err(Failure::Transient(e)) => unwritten.failed(&e, counters),
                Err(Failure::Permanent(e)) => {
                    tracing::warn!(records = unwritten.records.len(), error = %e, "log write failed: records lost");
                    unwritten.give_up(counters);
                }
                Err(Failure::Reopen) => return Stop::Reopen,
            }
        }
        unwritten.answer_flushes_if_written();
        if closed && unwritten.records.is_empty() {
            return Stop::Closed;
        }
    }
}
