//! One request's path: the body read once ([`body`]), the analysis of the conversation
//! ([`Analyser`]), the ruling carried out ([`intervention`]), the answer streamed back
//! through the tee and recorded, a block check on answers that may complete a loop, held
//! requests; and the same for each turn of a Responses WebSocket ([`Upgradable`]).

mod analysis;
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
pub use block::BlockBody;
pub use handler::handle;
pub use websocket::Upgradable;
