//! `loopwarden health`: the container's health check. It takes `serve`'s options and reads
//! the configuration as `serve` does (file, environment, flags), so it asks the address the
//! proxy listens on whatever set it, and succeeds when `/healthz` answers `200`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::time::Duration;

/// How long the check waits to connect, and then for the answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Entry point of `loopwarden health`, which takes `serve`'s options.
pub fn run(args: super::options::ServeArgs) -> anyhow::Result<()> {
    let config = args.load_config()?;
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
