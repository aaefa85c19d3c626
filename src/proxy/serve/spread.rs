//! How client connections are spread over the serving threads.
//!
//! One thread accepts every connection and gives it to the serving thread that has the
//! fewest open; that thread serves it, every request on it, until it closes.
//!
//! Why not let every thread accept from the listening socket: agents and their load open
//! keep-alive connections in bursts, and whichever thread wakes first takes the whole
//! burst (measured: 64 connections opened at once all landed on one of two threads, which
//! then served every request while the other idled: a fifth fewer requests per second and
//! a third more latency than an even split, BENCHMARKS.md). A connection changes threads once, when it is handed over; its requests never
//! do (see `serve_thread` in `proxy/mod.rs` for why that matters).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// An accepted connection on its way to the thread that serves it.
pub struct Handed {
    pub stream: std::net::TcpStream,
    pub peer: SocketAddr,
}

/// The serving threads' open connections, and the way to hand one a new connection.
/// Thread 0 is the one that accepts.
pub struct Spread {
    threads: Vec<Slot>,
}

struct Slot {
    /// Connections given to this thread and not yet closed.
    open: AtomicUsize,
    /// `None` for thread 0, which serves what it keeps itself.
    handoff: Option<mpsc::UnboundedSender<Handed>>,
}

impl Spread {
    /// A spread over `threads` serving threads (at least one), and for each thread after
    /// the first the receiving end of its hand-offs.
    pub fn new(threads: usize) -> (Spread, Vec<mpsc::UnboundedReceiver<Handed>>) {
        let mut receivers = Vec::new();
        let threads = (0..threads.max(1))
            .map(|i| {
                let handoff = (i > 0).then(|| {
                    let (send, receive) = mpsc::unbounded_channel();
                    receivers.push(receive);
                    send
                });
                Slot {
                    open: AtomicUsize::new(0),
                    handoff,
                }
            })
            .collect();
        (Spread { threads }, receivers)
    }

    /// Gives a connection accepted on thread 0 to the thread with the fewest open (thread 0
    /// on a tie): `None` when it went to another thread, the connection back when thread 0
    /// is to serve it. Either way it counts as open on that thread until [`Spread::closed`].
    pub fn place(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio::net::TcpStream> {
        let least = self
            .threads
            .iter()
            .enumerate()
            .min_by_key(|(_, slot)| slot.open.load(Ordering::Relaxed))
            .map_or(0, |(i, _)| i);
        let handoff = self.threads.get(least).and_then(|s| s.handoff.as_ref());
        let Some(handoff) = handoff else {
            self.opened(0);
            return Some(stream);
        };
        // Off this thread's event loop (the receiving thread registers it with its own).
        // Failing that (the socket is already broken), it is dropped: the client sees it close.
        let stream = stream.into_std().ok()?;
        self.opened(least);
        match handoff.send(Handed { stream, peer }) {
            Ok(()) => None,
            // That thread has stopped (the proxy is shutting down): serve it here.
            Err(mpsc::error::SendError(handed)) => {
                self.closed(least);
                let stream = tokio::net::TcpStream::from_std(handed.stream).ok()?;
                self.opened(0);
                Some(stream)
            }
        }
    }

    fn opened(&self, thread: usize) {
        if let Some(slot) = self.threads.get(thread) {
            slot.open.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection counted on `thread` has closed.
    pub fn closed(&self, thread: usize) {
        if let Some(slot) = self.threads.get(thread) {
            slot.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Open connections over all serving threads.
    pub fn total(&self) -> usize {
        self.threads
            .iter()
            .map(|slot| slot.open.load(Ordering::Relaxed))
            .sum()
    }

    /// Open connections per serving thread (the admin API shows them).
    pub fn open(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|slot| slot.open.load(Ordering::Relaxed))
            .collect()
    }
}
