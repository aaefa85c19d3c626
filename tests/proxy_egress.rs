//! The outbound proxy (src/proxy/egress.rs), over real sockets: a CONNECT proxy written
//! here, a TLS upstream trusted through `upstream.ca_file`, and the proxy in between.
//! Requests reach the upstream through the tunnel (TLS inside it, the certificate checked),
//! with the URL's credentials as `Proxy-Authorization`; `no_proxy` and loopback go direct;
//! a refusing or absent proxy is the 502 of an unreachable upstream, naming the proxy; the
//! WebSocket upgrade takes the same way; the binary says which proxy it uses and never its
//! password.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod proxy_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use loopwarden::config::Config;
use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{client, closed_port, Served, TestProxy, TEST_CERT, TEST_KEY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the test's proxy does with a `CONNECT`.
#[derive(Clone, Copy)]
enum Answer {
    /// 200, then the bytes both ways.
    Tunnel,
    /// `407 Proxy Authentication Required`, and the connection closed.
    Refuse,
    /// Nothing: the connection is held open without an answer.
    Silent,
}

/// A forward proxy that only tunnels, recording each `CONNECT` head it gets.
struct ConnectProxy {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    async fn start(answer: Answer) -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        match client.read_u8().await {
                            Ok(byte) => head.push(byte),
                            Err(_) => return,
                        }
                    }
                    let head = String::from_utf8(head).unwrap();
                    record.lock().unwrap().push(head.clone());
                    let target = head
                        .strip_prefix("CONNECT ")
                        .and_then(|rest| rest.split(' ').next())
                        .unwrap()
                        .to_string();
                    match answer {
                        Answer::Silent => {
                            let mut rest = Vec::new();
                            let _ = client.read_to_end(&mut rest).await;
                        }
                        Answer::Refuse => {
                            let refusal = "HTTP/1.1 407 Proxy Authentication Required\r\n\
                                           proxy-authenticate: Basic realm=\"corp\"\r\n\
                                           content-length: 0\r\n\r\n";
                            let _ = client.write_all(refusal.as_bytes()).await;
                        }
                        Answer::Tunnel => {
                            let mut upstream = TcpStream::connect(&target).await.unwrap();
                            client
                                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                                .await
                                .unwrap();
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        }
                    }
                });
            }
        });
        ConnectProxy { addr, heads }
    }

    fn url_with(&self, credentials: &str) -> String {
        format!("http://{credentials}{}", self.addr)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// An https upstream on 127.0.0.1 with [`TEST_CERT`]: it answers every request `200`
/// with `tls upstream saw <request line>`.
async fn tls_upstream() -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).unwrap();
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read_u8().await {
                        Ok(byte) => head.push(byte),
                        Err(_) => return,
                    }
                }
                let head = String::from_utf8(head).unwrap();
                let body = format!("tls upstream saw {}", head.lines().next().unwrap());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

/// A proxy in-process whose OpenAI upstream is the https `upstream`, trusting the test CA.
async fn proxy_to(upstream: SocketAddr, adjust: impl FnOnce(&mut Config)) -> TestProxy {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, TEST_CERT).unwrap();
    let base = format!("https://127.0.0.1:{}", upstream.port());
    TestProxy::start_in(&base, dir, |config| {
        config.upstream.ca_file = ca.display().to_string();
        adjust(config)
    })
    .await
}

async fn get(url: &str) -> (u16, String) {
    let response = client().get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn basic(credentials: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials)
    )
}

#[tokio::test]
async fn an_https_upstream_is_reached_through_the_tunnel_with_the_credentials() {
    let upstream = tls_upstream().await;
    let corp = ConnectProxy::start(Answer::Tunnel).await;
    let proxy = proxy_to(upstream, |c| {
        c.upstream.proxy = corp.url_with("alice:s%3Ccret@");
        c.upstream.proxy_loopback = true;
    })
    .await;
    let (status, body) = get(&proxy.url("/v1/models")).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "tls upstream saw GET /v1/models HTTP/1.1")
    );
    let heads = corp.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let target = format!("127.0.0.1:{}", upstream.port());
    assert!(
        heads[0].starts_with(&format!("CONNECT {target} HTTP/1.1\r\n")),
        "{heads:?}"
    );
    assert!(heads[0].contains(&format!("\r\nHost: {target}\r\n")));
    // The URL's credentials, percent-decoded, and nothing of the client's own.
    assert!(
        heads[0].contains(&format!(
            "\r\nProxy-Authorization: {}\r\n",
            basic("alice:s<cret")
        )),
        "{heads:?}"
    );
}

#[tokio::test]
async fn no_proxy_and_loopback_go_direct() {
    let upstream = tls_upstream().await;
    let corp = ConnectProxy::start(Answer::Tunnel).await;
    // Loopback is direct unless asked, the proxy set or not.
    let direct = proxy_to(upstream, |c| c.upstream.proxy = corp.url_with("")).await;
    assert_eq!(get(&direct.url("/v1/models")).await.0, 200);
    // Asked, but `no_proxy` names the host (here with its port).
    let listed = proxy_to(upstream, |c| {
        c.upstream.proxy = corp.url_with("");
        c.upstream.proxy_loopback = true;
        c.upstream.no_proxy = format!("example.com, 127.0.0.1:{}", upstream.port());
    })
    .await;
    assert_eq!(get(&listed.url("/v1/models")).await.0, 200);
    assert!(corp.heads().is_empty(), "{:?}", corp.heads());
    // The environment's NO_PROXY, when the setting is empty.
    let from_env = proxy_to(upstream, |c| {
        c.upstream.proxy = corp.url_with("");
        c.upstream.proxy_loopback = true;
        c.upstream.proxy_env.no_proxy = Some(("NO_PROXY", "10.0.0.0/8,127.0.0.0/8".into()));
    })
    .await;
    assert_eq!(get(&from_env.url("/v1/models")).await.0, 200);
    assert!(corp.heads().is_empty(), "{:?}", corp.heads());
    // `none` ignores the environment's proxy.
    let none = proxy_to(upstream, |c| {
        c.upstream.proxy = "none".into();
        c.upstream.proxy_loopback = true;
        c.upstream.proxy_env.https = Some(("HTTPS_PROXY", corp.url_with("")));
    })
    .await;
    assert_eq!(get(&none.url("/v1/models")).await.0, 200);
    assert!(corp.heads().is_empty(), "{:?}", corp.heads());
}

/// The 502 of an unreachable upstream, in the API's error shape, saying the proxy was
/// the hop that failed.
async fn assert_proxy_502(proxy: &TestProxy, says: &str) {
    let unreachable = TestProxy::start(&format!("https://127.0.0.1:{}", closed_port().await)).await;
    let reference = client()
        .post(unreachable.url("/v1/chat/completions"))
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(reference.status(), 502);
    let reference: serde_json::Value =
        serde_json::from_slice(&reference.bytes().await.unwrap()).unwrap();

    let response = client()
        .post(proxy.url("/v1/chat/completions"))
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let message = body["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("outbound proxy") && message.contains(says),
        "{message}"
    );
    // The same shape, fields and error type as an unreachable upstream's.
    let mut shape = body.clone();
    shape["error"]["message"] = reference["error"]["message"].clone();
    assert_eq!(shape, reference);
}

#[tokio::test]
async fn a_proxy_that_refuses_or_is_not_there_is_a_502_naming_it() {
    let upstream = tls_upstream().await;
    let corp = ConnectProxy::start(Answer::Refuse).await;
    let refused = proxy_to(upstream, |c| {
        c.upstream.proxy = corp.url_with("alice:wrong@");
        c.upstream.proxy_loopback = true;
    })
    .await;
    assert_proxy_502(&refused, "407 Proxy Authentication Required").await;
    assert_proxy_502(&refused, &format!("http://{} refused", corp.addr)).await;
    assert_eq!(corp.heads().len(), 2, "one CONNECT per request");
    let absent = format!("http://127.0.0.1:{}", closed_port().await);
    let unreachable = proxy_to(upstream, |c| {
        c.upstream.proxy = absent.clone();
        c.upstream.proxy_loopback = true;
    })
    .await;
    assert_proxy_502(&unreachable, &format!("{absent} cannot be reached")).await;
    // A proxy that takes the connection and never answers: the connect timeout, naming it.
    let silent = ConnectProxy::start(Answer::Silent).await;
    let waiting = proxy_to(upstream, |c| {
        c.upstream.proxy = silent.url_with("");
        c.upstream.proxy_loopback = true;
        c.upstream.connect_timeout_ms = 300;
    })
    .await;
    let says = format!("through the outbound proxy http://{}", silent.addr);
    assert_proxy_502(&waiting, &says).await;
}

#[tokio::test]
async fn the_websocket_upgrade_goes_through_the_same_proxy() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("fine")]))
        .await
        .unwrap();
    let corp = ConnectProxy::start(Answer::Tunnel).await;
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.upstream.proxy = corp.url_with("");
        c.upstream.proxy_loopback = true;
    })
    .await;
    let addr = proxy.running.addr();
    let upgrade = |addr: SocketAddr| {
        http::Request::builder()
            .uri(format!("ws://{addr}/v1/responses"))
            .header("host", addr.to_string())
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header(
                "sec-websocket-key",
                tokio_tungstenite::tungstenite::handshake::client::generate_key(),
            )
            .body(())
            .unwrap()
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (_ws, response) = tokio_tungstenite::client_async(upgrade(addr), tcp)
        .await
        .unwrap();
    assert_eq!(response.status(), 101);
    let mock_port = mock.url().rsplit(':').next().unwrap().to_string();
    let heads = corp.heads();
    assert!(
        heads.len() == 1 && heads[0].starts_with(&format!("CONNECT 127.0.0.1:{mock_port} ")),
        "{heads:?}"
    );

    // A refusing proxy: the upgrade gets the same 502.
    let refusing = ConnectProxy::start(Answer::Refuse).await;
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.upstream.proxy = refusing.url_with("");
        c.upstream.proxy_loopback = true;
    })
    .await;
    let addr = proxy.running.addr();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let error = tokio_tungstenite::client_async(upgrade(addr), tcp)
        .await
        .unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = error else {
        panic!("{error:?}");
    };
    assert_eq!(response.status(), 502);
    let body = String::from_utf8(response.body().clone().unwrap()).unwrap();
    assert!(
        body.contains("outbound proxy") && body.contains("407"),
        "{body}"
    );
    assert_eq!(refusing.heads().len(), 1);
}

/// The binary as deployed: the proxy from `HTTPS_PROXY`, its credentials sent to the proxy
/// and written nowhere; the startup log names the proxy in use.
#[tokio::test]
async fn the_environment_proxy_is_logged_at_startup_without_its_credentials() {
    let upstream = tls_upstream().await;
    let corp = ConnectProxy::start(Answer::Tunnel).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, TEST_CERT).unwrap();
    let config = dir.path().join("loopwarden.toml");
    std::fs::write(
        &config,
        format!(
            "[upstream]\nopenai = \"https://127.0.0.1:{}\"\nca_file = {:?}\nproxy_loopback = true\n",
            upstream.port(),
            ca.display().to_string()
        ),
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let password = "hunter2-not-a-real-one";
    let served = Served::start(
        &["--config", &config.display().to_string(), "--db", &db],
        &[
            ("HTTPS_PROXY", corp.url_with(&format!("bob:{password}@"))),
            ("NO_PROXY", "internal.example".into()),
            ("RUST_LOG", "debug".into()),
        ],
    )
    .await;
    let (status, body) = get(&format!("{}/v1/models", served.url)).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "tls upstream saw GET /v1/models HTTP/1.1")
    );
    let authorization = basic(&format!("bob:{password}"));
    assert!(
        corp.heads()[0].contains(&authorization),
        "{:?}",
        corp.heads()
    );
    let logs = served.stop().await;
    assert!(
        logs.contains(&format!(
            "outbound proxy: https upstreams: http://{}",
            corp.addr
        )),
        "{logs}"
    );
    assert!(logs.contains("internal.example"), "{logs}");
    for secret in [password, authorization.as_str()] {
        assert!(!logs.contains(secret), "{secret} in the logs: {logs}");
    }
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes
            .windows(password.len())
            .any(|w| w == password.as_bytes()));
    }
}

#[tokio::test]
async fn a_proxy_url_that_is_not_usable_stops_the_start_naming_its_source() {
    let env = |var: &str| (var == "HTTPS_PROXY").then(|| "socks5://bob:pw@proxy:1080".into());
    let e = Config::load(None, env).unwrap_err().to_string();
    assert!(
        e.contains("upstream.proxy") && e.contains("HTTPS_PROXY") && e.contains("socks5"),
        "{e}"
    );
    assert!(
        e.contains("none"),
        "says how to ignore the environment: {e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[upstream]\nproxy = \"http://bob:pw@proxy:notaport\"\n",
    )
    .unwrap();
    let e = Config::load(Some(&path), |_| None).unwrap_err().to_string();
    assert!(e.contains("upstream.proxy") && !e.contains("pw"), "{e}");
}
