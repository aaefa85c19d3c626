//! The outbound proxy: on a company network the upstream APIs are often reachable only
//! through an HTTP proxy. Which upstream connections go through one, and how: the upstream
//! client's connector ([`Tunnelling`]) asks [`Egress::proxy_for`] for each connection it
//! opens (requests, WebSocket upgrades and webhooks alike), and either dials the upstream
//! or asks the proxy for a tunnel to it (`CONNECT host:port`). Inside the tunnel the
//! connection is what it would be without one: TLS to the upstream (its certificate
//! checked as usual) for an https base, plain HTTP/1.1 for an http one.
//!
//! The settings: `upstream.proxy` (a URL, or `none`), else the environment's
//! `https_proxy`/`HTTPS_PROXY` (for https upstreams) and `http_proxy`/`HTTP_PROXY` (for
//! http ones); `upstream.no_proxy`, else `no_proxy`/`NO_PROXY`, names the hosts reached
//! directly ([`NoProxy`]). Loopback upstreams are reached directly unless
//! `upstream.proxy_loopback` is set.
//!
//! Credentials in the proxy's URL (`http://user:pass@host:port`) are sent as
//! `Proxy-Authorization: Basic` and appear nowhere else: [`Proxy`] shows itself without them.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine;
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The environment variables read, lowercase first (the spelling curl honours for
/// `http_proxy`), each pair for one setting.
pub const HTTPS_PROXY_VARS: [&str; 2] = ["https_proxy", "HTTPS_PROXY"];
pub const HTTP_PROXY_VARS: [&str; 2] = ["http_proxy", "HTTP_PROXY"];
pub const NO_PROXY_VARS: [&str; 2] = ["no_proxy", "NO_PROXY"];

/// What `upstream.proxy` says to mean "no proxy, whatever the environment says".
pub const NONE: &str = "none";

/// The proxy settings the environment gave when the config was loaded (read there, through
/// the same lookup as the `LOOPWARDEN_*` variables, so that tests need not touch the
/// process environment). Each holds the variable's name and its value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyEnv {
    pub https: Option<(&'static str, String)>,
    pub http: Option<(&'static str, String)>,
    pub no_proxy: Option<(&'static str, String)>,
}

impl ProxyEnv {
    pub fn read(env: impl Fn(&str) -> Option<String>) -> ProxyEnv {
        let first = |vars: [&'static str; 2]| {
            vars.into_iter()
                .find_map(|var| env(var).map(|value| (var, value)))
        };
        ProxyEnv {
            https: first(HTTPS_PROXY_VARS),
            http: first(HTTP_PROXY_VARS),
            no_proxy: first(NO_PROXY_VARS),
        }
    }
}

/// An HTTP proxy to tunnel through.
pub struct Proxy {
    /// `http://host:port/`, what is dialled.
    dial: Uri,
    /// `host:port`, credentials left out: what logs and errors show.
    shown: String,
    /// `Basic ...` of the URL's credentials, if it has any.
    authorization: Option<String>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("at", &self.shown)
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .finish()
    }
}

impl std::fmt::Display for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}", self.shown)
    }
}

impl Proxy {
    /// A proxy URL as people write it: `http://[user:pass@]host[:port][/]`, the scheme
    /// optional (`proxy:3128`), the port 80 when left out. Other schemes (an `https://`
    /// proxy, `socks5://`) are refused rather than misused.
    pub fn parse(url: &str) -> Result<Proxy, String> {
        let url = url.trim();
        let rest = match url.split_once("://") {
            None => url,
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(format!(
                    "a {scheme}:// proxy is not supported: give an http:// proxy (the tunnel to \
                     an https upstream is still TLS from end to end)"
                ))
            }
        };
        let rest = rest.trim_end_matches('/');
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, rest),
        };
        let shown_url = |hostport: &str| format!("http://{hostport}");
        let authority: http::uri::Authority = hostport
            .parse()
            .map_err(|_| format!("{} is not a proxy URL", shown_url(hostport)))?;
        if hostport.contains('/') || authority.host().is_empty() {
            return Err(format!(
                "{} is not a proxy URL like http://proxy:3128",
                shown_url(hostport)
            ));
        }
        let port = match authority.port_u16() {
            Some(port) => port,
            None if authority.as_str() == authority.host() => 80,
            None => return Err(format!("{} has no valid port", shown_url(hostport))),
        };
        let shown = format!("{}:{port}", authority.host());
        let dial = Uri::try_from(format!("http://{shown}/"))
            .map_err(|_| format!("http://{shown} is not a proxy URL"))?;
        let authorization = userinfo.map(|userinfo| {
            let decode = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let mut credentials = decode(user);
            credentials.push(b':');
            credentials.extend(decode(password));
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            )
        });
        Ok(Proxy {
            dial,
            shown,
            authorization,
        })
    }
}

/// `no_proxy`: the upstream hosts reached directly. Entries are separated by commas (or
/// spaces): `*` (every host), a domain (`example.com`, `.example.com` and `*.example.com`
/// all match it and every name under it), an IP address, or a CIDR range (`10.0.0.0/8`);
/// any of them with `:port` matches that port only. Names compare without case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NoProxy {
    entries: Vec<NoProxyEntry>,
}

#[derive(Debug, Clone, PartialEq)]
enum NoProxyEntry {
    All,
    /// A domain, lowercase, without a leading dot; the port, if the entry names one.
    Domain(String, Option<u16>),
    /// An address and the prefix length that must match (32 or 128 for one address).
    Range(IpAddr, u8, Option<u16>),
}

impl NoProxy {
    pub fn parse(list: &str) -> NoProxy {
        let entries = list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty())
            .map(NoProxyEntry::parse)
            .collect();
        NoProxy { entries }
    }

    /// Whether `host` (a name or an address, IPv6 with or without brackets) on `port` is
    /// reached directly.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let ip: Option<IpAddr> = host.parse().ok();
        let port_ok = |wanted: &Option<u16>| wanted.is_none_or(|p| p == port);
        self.entries.iter().any(|entry| match entry {
            NoProxyEntry::All => true,
            NoProxyEntry::Domain(domain, wanted) => {
                port_ok(wanted)
                    && (host == *domain
                        || host
                            .strip_suffix(domain.as_str())
                            .is_some_and(|head| head.ends_with('.')))
            }
            NoProxyEntry::Range(net, bits, wanted) => {
                port_ok(wanted) && ip.is_some_and(|ip| in_range(ip, *net, *bits))
            }
        })
    }
}

impl NoProxyEntry {
    fn parse(entry: &str) -> NoProxyEntry {
        if entry == "*" {
            return NoProxyEntry::All;
        }
        let (address, port) = split_port(entry);
        if let Some((net, bits)) = address.split_once('/') {
            if let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u8>()) {
                let max = if net.is_ipv4() { 32 } else { 128 };
                return NoProxyEntry::Range(net, bits.min(max), port);
            }
        }
        let bare = address.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            return NoProxyEntry::Range(ip, bits, port);
        }
        let domain = address
            .trim_start_matches("*.")
            .trim_start_matches('.')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        NoProxyEntry::Domain(domain, port)
    }
}

/// `host:port` split when what follows the last colon is a port (an IPv6 address in
/// brackets keeps its colons; one without brackets has no port).
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some((address, port)) = entry.rsplit_once(':') {
        let bracketed = address.starts_with('[') && address.ends_with(']');
        if bracketed || !address.contains(':') {
            if let Ok(port) = port.parse() {
                return (address, Some(port));
            }
        }
    }
    (entry, None)
}

fn in_range(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (ip, net, width) = match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => (u32::from(ip) as u128, u32::from(net) as u128, 32),
        (IpAddr::V6(ip), IpAddr::V6(net)) => (u128::from(ip), u128::from(net), 128),
        _ => return false,
    };
    let shift = width - u32::from(bits).min(width);
    shift >= 128 || (ip >> shift) == (net >> shift)
}

/// What the route of an upstream connection is decided from: `upstream.proxy`,
/// `upstream.no_proxy`, `upstream.proxy_loopback`, and the environment's proxy variables
/// as the config was loaded with them (`crate::config::UpstreamConfig::egress`).
pub struct Settings<'a> {
    pub proxy: &'a str,
    pub no_proxy: &'a str,
    pub proxy_loopback: bool,
    pub env: &'a ProxyEnv,
}

/// Which upstream connections go through which proxy: the one decision, made per
/// connection by [`Egress::proxy_for`].
#[derive(Debug, Default)]
pub struct Egress {
    /// For https upstreams, and for http ones.
    https: Option<Arc<Proxy>>,
    http: Option<Arc<Proxy>>,
    no_proxy: NoProxy,
    proxy_loopback: bool,
}

impl Egress {
    /// The decision `upstream`'s settings (and the environment they were loaded with)
    /// make. An error says what is wrong with `upstream.proxy`, and the environment
    /// variable it came from, if it did.
    pub fn of(upstream: &Settings<'_>) -> Result<Egress, (Option<&'static str>, String)> {
        let env = upstream.env;
        let (https, http) = match upstream.proxy.trim() {
            "" => {
                let from_env = |var: &Option<(&'static str, String)>| match var {
                    Some((name, url)) => {
                        Proxy::parse(url)
                            .map(|p| Some(Arc::new(p)))
                            .map_err(|problem| {
                                let way_out = "(upstream.proxy = \"none\" ignores the environment)";
                                (Some(*name), format!("{problem} {way_out}"))
                            })
                    }
                    None => Ok(None),
                };
                (from_env(&env.https)?, from_env(&env.http)?)
            }
            none if none.eq_ignore_ascii_case(NONE) => (None, None),
            url => {
                let proxy = Arc::new(Proxy::parse(url).map_err(|problem| (None, problem))?);
                (Some(proxy.clone()), Some(proxy))
            }
        };
        let no_proxy = NoProxy::parse(upstream_no_proxy(upstream));
        Ok(Egress {
            https,
            http,
            no_proxy,
            proxy_loopback: upstream.proxy_loopback,
        })
    }

    /// The proxy a connection to `uri` (`scheme://host[:port]/`) goes through, if any.
    pub fn proxy_for(&self, uri: &Uri) -> Option<&Arc<Proxy>> {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let proxy = if https { &self.https } else { &self.http }.as_ref()?;
        let host = uri.host()?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if !self.proxy_loopback && is_loopback(host) {
            return None;
        }
        (!self.no_proxy.matches(host, port)).then_some(proxy)
    }

    /// For the startup log: which proxy each kind of upstream goes through, without
    /// credentials; `None` when every connection is direct.
    pub fn describe(&self) -> Option<String> {
        let show =
            |p: &Option<Arc<Proxy>>| p.as_ref().map_or("direct".to_string(), |p| p.to_string());
        (self.https.is_some() || self.http.is_some()).then(|| {
            format!(
                "https upstreams: {}, http upstreams: {}",
                show(&self.https),
                show(&self.http)
            )
        })
    }
}

/// Says at startup which proxy upstream connections go through (credentials left out).
pub fn log_in_use(upstream: &Settings<'_>) {
    match Egress::of(upstream).map(|egress| egress.describe()) {
        Ok(Some(described)) => tracing::info!(
            no_proxy = upstream_no_proxy(upstream),
            proxy_loopback = upstream.proxy_loopback,
            "outbound proxy: {described}"
        ),
        Ok(None) => tracing::debug!("no outbound proxy: upstreams are reached directly"),
        Err((_, problem)) => tracing::warn!(%problem, "upstream.proxy not usable"),
    }
}

/// The `no_proxy` list in force, as written.
fn upstream_no_proxy<'a>(upstream: &Settings<'a>) -> &'a str {
    match (upstream.no_proxy.trim(), &upstream.env.no_proxy) {
        ("", Some((_, list))) => list,
        (list, _) => list,
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why a tunnel through the outbound proxy could not be made. Its messages name the proxy
/// (never its credentials), so that the client's 502 and the log say which hop failed.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("the outbound proxy {proxy} cannot be reached")]
    Unreachable {
        proxy: String,
        #[source]
        source: BoxError,
    },
    #[error("the outbound proxy {proxy} refused the tunnel to {target}: {status}")]
    Refused {
        proxy: String,
        target: String,
        /// The status line's code and reason, e.g. `407 Proxy Authentication Required`.
        status: String,
    },
    #[error("the outbound proxy {proxy} gave no valid answer to CONNECT {target}")]
    BadAnswer { proxy: String, target: String },
    #[error("the connection to the outbound proxy {proxy} failed")]
    Io {
        proxy: String,
        #[source]
        source: std::io::Error,
    },
}

/// Largest answer head to a `CONNECT` read; a proxy's is a line or two.
const MAX_CONNECT_ANSWER: usize = 16 * 1024;

/// The upstream client's TCP connector: dials the upstream, or the proxy [`Egress`] names
/// for it and opens a tunnel through it. What it yields is a TCP stream to the upstream
/// either way, on which `hyper_rustls` then does TLS when the upstream is https.
#[derive(Clone)]
pub struct Tunnelling {
    pub direct: HttpConnector,
    pub egress: Arc<Egress>,
}

impl tower::Service<Uri> for Tunnelling {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.direct.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        let Some(proxy) = self.egress.proxy_for(&dst).cloned() else {
            return Box::pin(async move { direct.call(dst).await.map_err(Into::into) });
        };
        Box::pin(async move {
            let io =
                direct
                    .call(proxy.dial.clone())
                    .await
                    .map_err(|e| TunnelError::Unreachable {
                        proxy: proxy.to_string(),
                        source: e.into(),
                    })?;
            let stream = tunnel(io.into_inner(), &proxy, &dst).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Asks the proxy on `stream` for a tunnel to `dst`'s host and port; the stream, now the
/// tunnel, once the proxy agreed (any 2xx).
async fn tunnel(mut stream: TcpStream, proxy: &Proxy, dst: &Uri) -> Result<TcpStream, TunnelError> {
    let https = dst.scheme() == Some(&http::uri::Scheme::HTTPS);
    let host = dst.host().unwrap_or_default();
    let target = format!(
        "{host}:{}",
        dst.port_u16().unwrap_or(if https { 443 } else { 80 })
    );
    let io_error = |source| TunnelError::Io {
        proxy: proxy.to_string(),
        source,
    };
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(authorization) = &proxy.authorization {
        head.push_str("Proxy-Authorization: ");
        head.push_str(authorization);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.map_err(io_error)?;
    let bad = || TunnelError::BadAnswer {
        proxy: proxy.to_string(),
        target: target.clone(),
    };
    // Read byte by byte up to the blank line: what follows it is the tunnel's (nothing,
    // until this side speaks), and must not be consumed here.
    let mut answer = Vec::with_capacity(256);
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() >= MAX_CONNECT_ANSWER {
            return Err(bad());
        }
        match stream.read_u8().await {
            Ok(byte) => answer.push(byte),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(bad()),
            Err(e) => return Err(io_error(e)),
        }
    }
    let status_line = answer
        .split(|&b| b == b'\n')
        .next()
        .map(|line| String::from_utf8_lossy(line).trim().to_string())
        .unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    if !version.starts_with("HTTP/1.") || code.len() != 3 || code.parse::<u16>().is_err() {
        return Err(bad());
    }
    if !code.starts_with('2') {
        let reason = parts.next().unwrap_or_default();
        return Err(TunnelError::Refused {
            proxy: proxy.to_string(),
            target,
            status: format!("{code} {reason}").trim_end().to_string(),
        });
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_as_people_write_them() {
        let p = Proxy::parse("http://alice:s%40cret@proxy.corp:3128/").unwrap();
        assert_eq!(p.to_string(), "http://proxy.corp:3128");
        assert_eq!(p.dial, "http://proxy.corp:3128/");
        let expected = base64::engine::general_purpose::STANDARD.encode("alice:s@cret");
        assert_eq!(p.authorization, Some(format!("Basic {expected}")));
        assert!(!format!("{p:?}").contains(&expected));
        assert_eq!(
            Proxy::parse("proxy:8080").unwrap().to_string(),
            "http://proxy:8080"
        );
        assert_eq!(
            Proxy::parse("HTTP://proxy").unwrap().to_string(),
            "http://proxy:80"
        );
        assert!(Proxy::parse("http://proxy:8080")
            .unwrap()
            .authorization
            .is_none());
        let e = Proxy::parse("socks5://proxy:1080").unwrap_err();
        assert!(e.contains("socks5") && e.contains("http://"), "{e}");
        let e = Proxy::parse("http://user:pw@proxy:99999").unwrap_err();
        assert!(!e.contains("pw"), "{e}");
        assert!(Proxy::parse("http://").is_err());
        assert!(Proxy::parse("http://proxy:80/path").is_err());
    }

    #[test]
    fn no_proxy_matches_domains_addresses_ranges_and_ports() {
        let list = NoProxy::parse(
            ".corp.example, Internal.Example  10.0.0.0/8,192.168.1.7,[::1]:8443,gw.example:8080",
        );
        for (host, port) in [
            ("corp.example", 443),
            ("api.corp.example", 443),
            ("a.b.internal.example", 80),
            ("INTERNAL.example.", 443),
            ("10.20.30.40", 443),
            ("192.168.1.7", 80),
            ("[::1]", 8443),
            ("gw.example", 8080),
        ] {
            assert!(list.matches(host, port), "{host}:{port} is direct");
        }
        for (host, port) in [
            ("notcorp.example", 443),
            ("example", 443),
            ("11.0.0.1", 443),
            ("192.168.1.8", 80),
            ("::1", 443),
            ("gw.example", 443),
            ("api.openai.com", 443),
        ] {
            assert!(!list.matches(host, port), "{host}:{port} is proxied");
        }
        assert!(NoProxy::parse("*").matches("anything", 1));
        assert!(NoProxy::parse("*.example.com").matches("example.com", 443));
        assert!(!NoProxy::parse("").matches("example.com", 443));
    }

    fn upstream(
        proxy: &str,
        no_proxy: &str,
        env: &[(&str, &str)],
    ) -> crate::config::UpstreamConfig {
        let mut config = crate::config::Config::default().upstream;
        config.proxy = proxy.into();
        config.no_proxy = no_proxy.into();
        config.proxy_env = ProxyEnv::read(|var| {
            env.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        });
        config
    }

    fn via(egress: &Egress, url: &str) -> Option<String> {
        egress
            .proxy_for(&url.parse().unwrap())
            .map(|p| p.to_string())
    }

    #[test]
    fn the_setting_wins_over_the_environment_and_none_says_direct() {
        let env = [
            ("HTTPS_PROXY", "http://secure:3128"),
            ("http_proxy", "http://plain:3128"),
            ("HTTP_PROXY", "http://ignored:3128"),
            ("NO_PROXY", "internal.example"),
        ];
        let from_env = Egress::of(&upstream("", "", &env).egress()).unwrap();
        assert_eq!(
            via(&from_env, "https://api.openai.com/").as_deref(),
            Some("http://secure:3128")
        );
        assert_eq!(
            via(&from_env, "http://gateway:8000/").as_deref(),
            Some("http://plain:3128")
        );
        assert_eq!(via(&from_env, "https://llm.internal.example/"), None);
        // Loopback stays direct unless asked.
        assert_eq!(via(&from_env, "https://127.0.0.1:9000/"), None);
        assert_eq!(via(&from_env, "http://localhost:9000/"), None);
        assert_eq!(via(&from_env, "http://[::1]:9000/"), None);
        let mut asked = upstream("", "", &env);
        asked.proxy_loopback = true;
        let asked = Egress::of(&asked.egress()).unwrap();
        assert_eq!(
            via(&asked, "https://127.0.0.1:9000/").as_deref(),
            Some("http://secure:3128")
        );

        let set =
            Egress::of(&upstream("http://mine:8080", "other.example", &env).egress()).unwrap();
        assert_eq!(
            via(&set, "https://api.openai.com/").as_deref(),
            Some("http://mine:8080")
        );
        assert_eq!(
            via(&set, "http://gateway/").as_deref(),
            Some("http://mine:8080")
        );
        // `upstream.no_proxy` replaces NO_PROXY.
        assert_eq!(
            via(&set, "https://llm.internal.example/").as_deref(),
            Some("http://mine:8080")
        );
        assert_eq!(via(&set, "https://other.example/"), None);

        let none = Egress::of(&upstream("none", "", &env).egress()).unwrap();
        assert_eq!(via(&none, "https://api.openai.com/"), None);
        assert_eq!(none.describe(), None);
        assert_eq!(
            from_env.describe().as_deref(),
            Some("https upstreams: http://secure:3128, http upstreams: http://plain:3128")
        );

        let bad =
            Egress::of(&upstream("", "", &[("HTTPS_PROXY", "socks5://x:1")]).egress()).unwrap_err();
        assert_eq!(bad.0, Some("HTTPS_PROXY"));
    }
}
