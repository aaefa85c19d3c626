//! loopwarden: a reverse proxy that keeps LLM coding agents out of unproductive loops.
//!
//! Follow a request as data: bytes in → [`dialect`] parses a [`transcript::Transcript`] →
//! [`actions`] reads what each tool call does → detection ([`detect`]) folds the facts,
//! finds loops and decides → [`intervene`] rules on the decision and rewrites or answers →
//! [`proxy`] forwards and tees the response → [`store`] logs it. The steps from bytes to a
//! decision are one call, `proxy::forward::analysis::Analyser::analyse`, which the proxy, the
//! benchmarks and `loopwarden replay` share.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "input never panics the proxy: errors are answered or logged (Cargo.toml)"
)]
#![allow(
    rustdoc::private_intra_doc_links,
    reason = "the docs are for maintainers (`cargo doc --document-private-items`): modules point at their private parts"
)]

pub mod actions;
pub mod budget;
pub mod config;
pub mod demo;
pub mod detect;
pub mod dialect;
pub mod egress;
pub mod glob;
pub mod intervene;
pub mod interventions;
pub mod metrics;
pub mod mock;
pub mod names;
pub mod normalize;
pub mod own_cookie;
pub mod policies;
pub mod policy;
pub mod process_log;
pub mod proxy;
pub mod reload;
pub mod replay;
pub mod replicas;
pub mod request_bytes;
pub mod run;
pub mod scan;
pub mod spawn;
pub mod store;
pub mod telemetry;
pub mod throttle;
pub mod transcript;
