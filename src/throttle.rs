//! Warnings that a client can cause once per request (a body the proxy cannot read, an
//! unknown `previous_response_id`, an upstream that cannot be reached), kept from flooding
//! the log: at most one line per period, the next line counting the ones left out
//! (`more_since_last`). Lock-free, so the request path pays two atomic operations.
//!
//! Every such warning goes through [`warn_per_request!`], which gives its call site a
//! budget of its own: one kind of warning in a flood leaves the others to be seen. Each
//! request has its row in the log all the same.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The period of a per-request warning: one line per 10 s at most.
pub const PER_REQUEST_MS: i64 = 10_000;

/// `tracing::warn!` for a warning a request can cause, through a [`Throttle`] of this call
/// site's own ([`PER_REQUEST_MS`]); the line written carries `more_since_last`, the
/// occurrences left out before it. Takes `warn!`'s fields and message.
#[macro_export]
macro_rules! warn_per_request {
    ($($fields:tt)+) => {{
        static THROTTLE: $crate::throttle::Throttle =
            $crate::throttle::Throttle::new($crate::throttle::PER_REQUEST_MS);
        if let Some(skipped) = THROTTLE.admit($crate::store::now_ms()) {
            tracing::warn!(more_since_last = skipped, $($fields)+);
        }
    }};
}

/// One kind of warning's budget of log lines.
pub struct Throttle {
    every_ms: i64,
    /// When the next line may be written, ms since the epoch.
    next_ms: AtomicI64,
    /// Lines left out since the last one written.
    skipped: AtomicU64,
}

impl Throttle {
    pub const fn new(every_ms: i64) -> Throttle {
        Throttle {
            every_ms,
            next_ms: AtomicI64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// At `now_ms`: `Some(skipped)` when this occurrence is written (`skipped` occurrences
    /// having been left out since the last line), `None` when it is left out. Of several
    /// threads arriving together after the period, one writes.
    pub fn admit(&self, now_ms: i64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let won = now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + self.every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if won {
            Some(self.skipped.swap(0, Ordering::Relaxed))
        } else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn one_line_per_period_and_the_next_counts_the_ones_left_out() {
        let t = Throttle::new(10_000);
        assert_eq!(t.admit(1_000), Some(0));
        for at in [1_001, 5_000, 10_999] {
            assert_eq!(t.admit(at), None);
        }
        assert_eq!(t.admit(11_000), Some(3));
        assert_eq!(t.admit(11_001), None);
        assert_eq!(t.admit(30_000), Some(1));
    }
}
