//! `loopwarden health`: the container's health check. It reads the configuration as
//! `serve` does (file, environment, flag), so it asks the address the proxy listens on
//! whatever set it, and succeeds when `/healthz` answers `200`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::time::Duration;

use crate::config::Config;

/// How long the check waits to connect, and then for the answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Options of `loopwarden health`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Config file (TOML), as given to `serve`.
    #[arg(long, env = "LOOPWARDEN_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Address the proxy listens on (overrides the config and LOOPWARDEN_LISTEN).
    #[arg(long)]
    pub listen: Option<String>,
}

pub fn run(args: HealthArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), |var| std::env::var(var).ok())?
        .with_flags(args.listen, None)?;
    let mut addr = config
        .listen_addr()
        .map_err(|e| anyhow::anyhow!("config key `server.listen`: {e}"))?;
    // Listening on every interface: ask over loopback.
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let unhealthy = |e: &dyn std::fmt::Display| anyhow::anyhow!("no answer from {addr}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| unhealthy(&e))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| unhealthy(&e))?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: loopwarden\r\nconnection: close\r\n\r\n")
        .map_err(|e| unhealthy(&e))?;
    let mut answer = Vec::new();
    stream
        .take(4096)
        .read_to_end(&mut answer)
        .map_err(|e| unhealthy(&e))?;
    let status = String::from_utf8_lossy(&answer);
    let status = status.lines().next().unwrap_or("");
    if status.starts_with("HTTP/1.1 200") {
        println!("ok");
        Ok(())
    } else {
        Err(anyhow::anyhow!("{addr} answered {status:?}"))
    }
}
