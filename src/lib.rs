//! loopwarden: a reverse proxy that keeps LLM coding agents out of unproductive loops.
//!
//! Follow a request as data: bytes in → [`dialect`] parses a [`transcript::Transcript`] →
//! detection ([`detect`]) classifies its tool calls, finds loops and decides → the
//! intervention rewrites or answers → [`proxy`] forwards and tees the response → the
//! store logs it.

pub mod actions;
pub mod config;
pub mod demo;
pub mod detect;
pub mod dialect;
pub mod intervene;
pub mod mock;
pub mod normalize;
pub mod proxy;
pub mod replay;
pub mod spawn;
pub mod store;
pub mod transcript;
