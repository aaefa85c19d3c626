//! One request's path ([`handle`]): the body read once (`body`), the analysis of the
//! conversation ([`Analyser`]), the ruling carried out (`intervention`: forwarded,
//! rewritten, answered here, or held for a human: `held`), the bytes sent upstream, the
//! answer streamed back through the tee (`tee`, with `block` checking an answer that may
//! complete a loop) and logged off the path (`record`). Each turn of a Responses WebSocket
//! goes the same way ([`open_websocket`]). [`App`] is what every request shares.

mod analysis;
mod app;
mod block;
mod body;
mod errors;
mod handler;
mod held;
mod intervention;
mod large_buffer;
mod record;
mod tee;
mod websocket;

pub use analysis::{Analyser, Arrival};
pub use app::{App, Place};
pub use block::BlockBody;
pub use handler::handle;
pub use websocket::{open as open_websocket, Upgradable};
