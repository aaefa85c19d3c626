//! The operator's surface, answered by the proxy itself: the admin API, the dashboard,
//! the `/metrics` scrape, and the router that serves them ([`router`]).

mod admin;
mod dashboard;
mod own;
mod scrape;
mod session;

pub use own::{answered_here, router};
