//! Serving client connections: each connection's life and its reaping ([`Connections`]),
//! TLS on the listener, where a request goes ([`route`]), the spread of connections over
//! the serving threads ([`Spread`]), the health check, and the allocator's settings.

mod allocator;
mod connection;
mod cut;
mod health;
mod listener_tls;
mod options;
pub mod route;
mod spread;

pub use allocator::keep_large_blocks;
#[cfg(all(test, target_os = "linux"))]
pub use allocator::minor_faults;
pub use connection::{
    raise_open_file_limit, Admission, Connections, Limits, Serving, Watch, Watched,
};
pub use cut::Cut;
pub use health::run as check_health;
pub use listener_tls::wrap as wrap_tls;
pub use options::ServeArgs;
pub use spread::{Handed, Spread};
