//! The end of a stop's grace period, which every connection and stream watches.

use std::sync::Arc;

/// The end of a stop's grace period: the connections, streams and WebSockets still open
/// then are cut (a response cut so is logged `cut_at_shutdown`). Shared by every serving
/// thread; it only ever turns on.
#[derive(Clone)]
pub struct Cut(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Cut {
    /// Not cut (yet).
    fn default() -> Cut {
        Cut(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Cut {
    /// Cuts what is still open.
    pub fn now(&self) {
        self.0.send_replace(true);
    }

    /// Whether the grace is over.
    pub fn is_done(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the grace is over.
    pub async fn done(&self) {
        let mut cut = self.0.subscribe();
        let _ = cut.wait_for(|cut| *cut).await;
    }
}
