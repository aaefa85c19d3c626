//! The upstream client's pool (src/proxy/upstream/client.rs), against a bare HTTP/1.1 upstream on
//! loopback that counts its connections and can close them the ways real upstreams do:
//! connections are reused, never shared while a response is still streaming, never reused
//! once closed, closed when idle too long, bounded; a request a closed pooled connection
//! gave back is resent once, and one that reached the upstream never is.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod proxy_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use loopwarden::config::{Config, UpstreamConfig};
use loopwarden::proxy::serve::route::Upstream;
use loopwarden::proxy::upstream::{self, Outgoing};
use loopwarden::request_bytes::RequestBytes;
use proxy_support::{client, eventually, TestProxy, TEST_CERT, TEST_KEY};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

/// What the upstream does with the `nth` request (from 0) of its `conn`-th connection.
#[derive(Clone)]
enum Act {
    /// 200, body `conn/nth`, the connection kept open.
    Answer,
    /// The same, then once `close` gives a permit the upstream closes the connection (as its
    /// idle timeout would), without having said `connection: close`.
    AnswerThenClose(Arc<Semaphore>),
    /// 200 with `connection: close`, the connection then left open by the upstream (only
    /// the client's side closes it).
    AnswerSayingClose,
    /// Reads the request, then closes the connection without answering.
    HangUp,
    /// A chunked event stream: one event now, the last once `release` gives a permit.
    Stream(Arc<Semaphore>),
}

#[derive(Debug, Default, Clone)]
struct ConnSeen {
    /// Each request's head, as received.
    heads: Vec<String>,
    /// The proxy closed its side (read returned 0 or failed).
    closed_by_proxy: bool,
    /// The upstream closed it (`AnswerThenClose`, `HangUp`).
    closed_by_upstream: bool,
    /// Over TLS: the protocol the client and the upstream agreed on by ALPN.
    alpn: Option<Vec<u8>>,
}

/// A bare HTTP/1.1 upstream on its own thread and event loop (independent of the test's).
struct BareUpstream {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<ConnSeen>>>,
}

impl BareUpstream {
    fn start(script: impl Fn(usize, usize) -> Act + Send + Sync + 'static) -> BareUpstream {
        BareUpstream::serve(script, None)
    }

    /// The same over TLS, with [`TEST_CERT`] for 127.0.0.1, offering `h2` before
    /// `http/1.1` by ALPN (so a client that offered `h2` would get it).
    fn start_tls(script: impl Fn(usize, usize) -> Act + Send + Sync + 'static) -> BareUpstream {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let cert = CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).unwrap();
        let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap();
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        BareUpstream::serve(script, Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))))
    }

    fn serve(
        script: impl Fn(usize, usize) -> Act + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> BareUpstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<ConnSeen>>> = Arc::default();
        let shared = conns.clone();
        let script: Script = Arc::new(script);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((stream, _)) = listener.accept().await {
                    let conn = {
                        let mut c = shared.lock().unwrap();
                        c.push(ConnSeen::default());
                        c.len() - 1
                    };
                    let (seen, script, tls) = (shared.clone(), script.clone(), tls.clone());
                    tokio::spawn(async move {
                        match tls {
                            None => serve_conn(stream, conn, seen, script).await,
                            Some(tls) => {
                                let Ok(stream) = tls.accept(stream).await else {
                                    return;
                                };
                                let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                                seen.lock().unwrap()[conn].alpn = alpn;
                                serve_conn(stream, conn, seen, script).await
                            }
                        }
                    });
                }
            });
        });
        BareUpstream { addr, conns }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn conns(&self) -> Vec<ConnSeen> {
        self.conns.lock().unwrap().clone()
    }

    fn requests(&self) -> usize {
        self.conns().iter().map(|c| c.heads.len()).sum()
    }
}

type Script = Arc<dyn Fn(usize, usize) -> Act + Send + Sync>;

async fn serve_conn(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    conn: usize,
    seen: Arc<Mutex<Vec<ConnSeen>>>,
    script: Script,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    for nth in 0.. {
        // One request: the head, then a content-length body.
        let head_end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    seen.lock().unwrap()[conn].closed_by_proxy = true;
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + length);
        seen.lock().unwrap()[conn].heads.push(head);
        let body = format!("{conn}/{nth}");
        let plain = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        match script(conn, nth) {
            Act::Answer => {
                if stream.write_all(plain.as_bytes()).await.is_err() {
                    return;
                }
            }
            Act::AnswerThenClose(close) => {
                let _ = stream.write_all(plain.as_bytes()).await;
                if let Ok(permit) = close.acquire().await {
                    permit.forget();
                }
                drop(stream);
                seen.lock().unwrap()[conn].closed_by_upstream = true;
                return;
            }
            Act::AnswerSayingClose => {
                let closing = plain.replacen("\r\n\r\n", "\r\nconnection: close\r\n\r\n", 1);
                if stream.write_all(closing.as_bytes()).await.is_err() {
                    return;
                }
            }
            Act::HangUp => {
                drop(stream);
                seen.lock().unwrap()[conn].closed_by_upstream = true;
                return;
            }
            Act::Stream(release) => {
                let event = |data: &str| {
                    let e = format!("data: {data}\n\n");
                    format!("{:x}\r\n{e}\r\n", e.len())
                };
                let start = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
                    event(&format!("first {body}"))
                );
                if stream.write_all(start.as_bytes()).await.is_err() {
                    return;
                }
                if let Ok(permit) = release.acquire().await {
                    permit.forget();
                }
                let end = format!("{}0\r\n\r\n", event("last"));
                if stream.write_all(end.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A proxy with one serving thread (one upstream pool) in front of `upstream`.
async fn proxy(upstream: &str, adjust: impl FnOnce(&mut Config)) -> TestProxy {
    TestProxy::start_with(upstream, |c| {
        c.server.threads = 1;
        adjust(c);
    })
    .await
}

async fn get(http: &reqwest::Client, url: &str) -> (u16, String) {
    let response = http.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection() {
    let up = BareUpstream::start(|_, _| Act::Answer);
    let proxy = proxy(&up.url(), |_| {}).await;
    let http = client();
    for nth in 0..5 {
        let (status, body) = get(&http, &proxy.url("/v1/models")).await;
        assert_eq!((status, body), (200, format!("0/{nth}")));
    }
    // A client connection of its own (it may be served by the same thread's pool).
    let (status, body) = get(&client(), &proxy.url("/v1/models")).await;
    assert_eq!((status, body.as_str()), (200, "0/5"));
    assert_eq!(up.conns().len(), 1, "one upstream connection for all");
}

#[tokio::test]
async fn the_request_target_and_host_come_from_the_configured_base() {
    let up = BareUpstream::start(|_, _| Act::Answer);
    let proxy = proxy(&up.url(), |c| {
        c.upstream.openai = format!("{}/api/", up.url())
    })
    .await;
    let (status, _) = get(
        &client(),
        &proxy.url("/openai/v1/models?limit=2&after=x%20y"),
    )
    .await;
    assert_eq!(status, 200);
    let head = up.conns()[0].heads[0].to_ascii_lowercase();
    assert!(
        head.starts_with("get /api/v1/models?limit=2&after=x%20y http/1.1\r\n"),
        "{head}"
    );
    let host = format!("\r\nhost: {}\r\n", up.addr);
    assert_eq!(head.matches(&host).count(), 1, "{head}");
}

/// A script whose first connection answers, then closes once `close` gets a permit; every
/// later connection just answers.
fn first_connection_closes_on_signal() -> (Arc<Semaphore>, impl Fn(usize, usize) -> Act) {
    let close = Arc::new(Semaphore::new(0));
    let signal = close.clone();
    let script = move |conn: usize, _: usize| match conn {
        0 => Act::AnswerThenClose(signal.clone()),
        _ => Act::Answer,
    };
    (close, script)
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
    let (close, script) = first_connection_closes_on_signal();
    let up = BareUpstream::start(script);
    let proxy = proxy(&up.url(), |_| {}).await;
    let http = client();
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "0/0".into())
    );
    close.add_permits(1);
    assert!(eventually(|| up.conns()[0].closed_by_upstream).await);
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "1/0".into())
    );
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "1/1".into())
    );
    assert_eq!(up.conns().len(), 2);
}

#[tokio::test]
async fn an_answer_that_says_connection_close_ends_its_connection() {
    let up = BareUpstream::start(|conn, _| match conn {
        0 => Act::AnswerSayingClose,
        _ => Act::Answer,
    });
    let proxy = proxy(&up.url(), |_| {}).await;
    let http = client();
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "0/0".into())
    );
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "1/0".into())
    );
    assert!(
        eventually(|| up.conns()[0].closed_by_proxy).await,
        "the proxy closes it"
    );
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "1/1".into())
    );
}

#[tokio::test]
async fn a_request_that_reached_the_upstream_is_never_sent_again() {
    let up = BareUpstream::start(|_, nth| match nth {
        0 => Act::Answer,
        _ => Act::HangUp,
    });
    let proxy = proxy(&up.url(), |_| {}).await;
    let http = client();
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "0/0".into())
    );
    // Sent over the pooled connection, read by the upstream, never answered.
    let (status, body) = get(&http, &proxy.url("/v1/models")).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("could not be reached"), "{body}");
    assert_eq!(up.conns().len(), 1, "no second connection: not resent");
    assert_eq!(up.requests(), 2);
}

#[tokio::test]
async fn a_connection_still_streaming_is_not_handed_to_another_request() {
    let release = Arc::new(Semaphore::new(0));
    let script = {
        let release = release.clone();
        move |conn: usize, nth: usize| match (conn, nth) {
            (0, 0) => Act::Stream(release.clone()),
            _ => Act::Answer,
        }
    };
    let up = BareUpstream::start(script);
    let proxy = proxy(&up.url(), |_| {}).await;
    let mut streaming = client().get(proxy.url("/v1/models")).send().await.unwrap();
    let first = streaming.chunk().await.unwrap().unwrap();
    assert_eq!(first, Bytes::from("data: first 0/0\n\n"));

    // Meanwhile, from another client connection: a connection of its own upstream.
    let (status, body) = get(&client(), &proxy.url("/v1/models")).await;
    assert_eq!((status, body.as_str()), (200, "1/0"));
    assert_eq!(up.conns().len(), 2);

    release.add_permits(1);
    let mut rest = Vec::new();
    while let Some(chunk) = streaming.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"data: last\n\n");
    // Both are idle now: the next request reuses one of them.
    let (status, body) = get(&client(), &proxy.url("/v1/models")).await;
    assert_eq!(status, 200);
    assert!(body == "0/1" || body == "1/1", "{body}");
    assert_eq!(up.conns().len(), 2);
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let up = BareUpstream::start(|_, _| Act::Answer);
    let proxy = proxy(&up.url(), |c| c.upstream.pool_idle_timeout_secs = 1).await;
    let http = client();
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "0/0".into())
    );
    assert!(
        eventually(|| up.conns()[0].closed_by_proxy).await,
        "the idle connection is closed by the proxy"
    );
    assert_eq!(
        get(&http, &proxy.url("/v1/models")).await,
        (200, "1/0".into())
    );
}

// ---- the client alone, where the test needs its counters ----

fn config(upstream: &str) -> UpstreamConfig {
    let mut config = Config::default().upstream;
    config.openai = upstream.to_string();
    config.anthropic = upstream.to_string();
    config.gemini = upstream.to_string();
    config
}

/// TLS settings that trust `certs` only.
fn tls_trusting(certs: &[&str]) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for pem in certs {
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        roots.add(cert).unwrap();
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn request(client: &upstream::Client) -> http::Request<Outgoing> {
    let mut request =
        http::Request::new(Outgoing::new(RequestBytes::from(Bytes::from_static(b"{}"))));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = client
        .target(Upstream::OpenAi, "/v1/chat/completions", None)
        .unwrap();
    request
}

async fn body_text(response: http::Response<upstream::ResponseBody>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn a_request_a_closed_pooled_connection_gave_back_is_resent_once_on_a_new_one() {
    let (close, script) = first_connection_closes_on_signal();
    let up = BareUpstream::start(script);
    let client = upstream::Client::new(&config(&up.url()));
    let response = client
        .send(Upstream::OpenAi, request(&client))
        .await
        .unwrap();
    assert_eq!(body_text(response).await, "0/0");
    assert_eq!(client.stats().idle, 1);
    // The upstream closes the idle connection. Blocking here (not awaiting) keeps this
    // thread's event loop from seeing it, so the pool still holds the connection as open:
    // the keep-alive race, on purpose.
    close.add_permits(1);
    let closed = std::time::Instant::now();
    while !up.conns()[0].closed_by_upstream {
        assert!(
            closed.elapsed() < Duration::from_secs(10),
            "upstream never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20));
    // The event loop learns of the close now, and polls this test (which it woke first)
    // before the connection's task: the request is queued on the closed connection, which
    // gives it back unsent.
    tokio::task::yield_now().await;
    let response = client
        .send(Upstream::OpenAi, request(&client))
        .await
        .unwrap();
    assert_eq!(body_text(response).await, "1/0");
    let stats = client.stats();
    assert_eq!((stats.opened, stats.retried), (2, 1), "{stats:?}");
    assert_eq!(up.requests(), 2, "the given-back request was sent once");
}

#[tokio::test]
async fn idle_connections_per_origin_are_bounded() {
    let release = Arc::new(Semaphore::new(0));
    let script = {
        let release = release.clone();
        move |_: usize, nth: usize| match nth {
            0 => Act::Stream(release.clone()),
            _ => Act::Answer,
        }
    };
    let up = BareUpstream::start(script);
    let client = upstream::Client::with_tls(&config(&up.url()), tls_trusting(&[]), 1);
    let (a, b) = tokio::join!(
        client.send(Upstream::OpenAi, request(&client)),
        client.send(Upstream::Anthropic, request(&client)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        client.stats().opened,
        2,
        "two streams at once, two connections"
    );
    release.add_permits(2);
    let (a, b) = tokio::join!(body_text(a), body_text(b));
    assert!(a.ends_with("data: last\n\n") && b.ends_with("data: last\n\n"));
    assert_eq!(client.stats().idle, 1);
    assert!(
        eventually(|| up.conns().iter().filter(|c| c.closed_by_proxy).count() == 1).await,
        "the connection beyond the bound is closed"
    );
}

#[tokio::test]
async fn an_upstream_nothing_listens_on_is_a_connect_error() {
    let port = proxy_support::closed_port().await;
    let client = upstream::Client::new(&config(&format!("http://127.0.0.1:{port}")));
    let error = client
        .send(Upstream::Gemini, request(&client))
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(error, upstream::Error::Connect { .. }),
        "{error:?}"
    );
    assert_eq!(client.stats().idle, 0);
}

#[tokio::test]
async fn https_upstreams_are_reached_over_tls_offering_only_http_1_1() {
    let up = BareUpstream::start_tls(|_, _| Act::Answer);
    let base = format!("https://127.0.0.1:{}", up.addr.port());
    let client = upstream::Client::with_tls(&config(&base), tls_trusting(&[TEST_CERT]), 4);
    for nth in 0..3 {
        let response = client
            .send(Upstream::Anthropic, request(&client))
            .await
            .unwrap();
        assert_eq!(body_text(response).await, format!("0/{nth}"));
    }
    let conns = up.conns();
    assert_eq!(conns.len(), 1, "one TLS connection, reused");
    assert_eq!(conns[0].alpn.as_deref(), Some(&b"http/1.1"[..]));
    let head = conns[0].heads[0].to_ascii_lowercase();
    // 443 is not this upstream's port: the Host names it.
    assert!(
        head.contains(&format!("\r\nhost: 127.0.0.1:{}\r\n", up.addr.port())),
        "{head}"
    );

    // A certificate the client does not trust: no connection, a connect error.
    let untrusting = upstream::Client::with_tls(&config(&base), tls_trusting(&[]), 4);
    let error = untrusting
        .send(Upstream::Anthropic, request(&untrusting))
        .await
        .expect_err("untrusted certificate");
    assert!(
        matches!(error, upstream::Error::Connect { .. }),
        "{error:?}"
    );
}

/// `upstream.ca_file`: an upstream whose certificate a private CA signed is reached once
/// the file names it, beside the built-in roots; a file that is not there or holds no
/// certificate is a config error naming the key.
#[tokio::test]
async fn a_private_ca_in_upstream_ca_file_is_trusted() {
    let up = BareUpstream::start_tls(|_, _| Act::Answer);
    let base = format!("https://127.0.0.1:{}", up.addr.port());
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, TEST_CERT).unwrap();

    let without = upstream::Client::new(&config(&base));
    let error = without
        .send(Upstream::Anthropic, request(&without))
        .await
        .expect_err("the private CA is not trusted by default");
    assert!(
        matches!(error, upstream::Error::Connect { .. }),
        "{error:?}"
    );

    let mut trusting = config(&base);
    trusting.ca_file = ca.display().to_string();
    let client = upstream::Client::new(&trusting);
    let response = client
        .send(Upstream::Anthropic, request(&client))
        .await
        .unwrap();
    // The upstream's second connection (the first failed its handshake), first request.
    assert_eq!(body_text(response).await, "1/0");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for (file, says) in [
        (dir.path().join("missing.pem"), "cannot read"),
        (empty, "no certificate"),
    ] {
        let env = |var: &str| (var == "LOOPWARDEN_LISTEN").then(|| "127.0.0.1:0".to_string());
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            format!("[upstream]\nca_file = {:?}\n", file.display().to_string()),
        )
        .unwrap();
        let e = Config::load(Some(&path), env).unwrap_err().to_string();
        assert!(e.contains("upstream.ca_file") && e.contains(says), "{e}");
    }
}
