//! TLS on the listener (`server.tls_cert`, `server.tls_key`; src/proxy/serve/listener_tls.rs): a
//! real TLS client trusting the test CA gets proxied answers and `/healthz` over HTTPS, on
//! HTTP/1.1 as the plain listener speaks; a certificate that cannot be used stops the start
//! with an error naming the key.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod proxy_support;

use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{Api, TestProxy, TEST_CERT, TEST_KEY};

/// `cert.pem` and `key.pem` (the test certificate, for 127.0.0.1 and localhost) in `dir`.
fn write_pair(dir: &std::path::Path) -> (String, String) {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, TEST_CERT).unwrap();
    std::fs::write(&key, TEST_KEY).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

/// An HTTPS client that trusts the test certificate only.
fn https_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(TEST_CERT.as_bytes()).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_tls_client_gets_proxied_answers_and_healthz() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("over TLS")]))
        .await
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(keys.path());
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.server.tls_cert = cert;
        c.server.tls_key = key;
    })
    .await;
    let url = proxy.running.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let client = https_client();

    let health = client.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.version(), http::Version::HTTP_11);

    let answer = client
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer sk-test")
        .body(Api::Chat.first_request("say hi", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.version(), http::Version::HTTP_11);
    let body = answer.text().await.unwrap();
    assert!(body.contains("over TLS"), "{body}");
    assert_eq!(mock.requests().len(), 1);

    // A streamed answer comes through whole.
    let streamed = client
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer sk-test")
        .body(Api::Chat.first_request("say hi", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let events = streamed.text().await.unwrap();
    assert!(
        events.contains("data: ") && events.trim_end().ends_with("data: [DONE]"),
        "{events}"
    );

    // Plain HTTP to the TLS listener gets no answer, and the listener keeps serving.
    let plain = proxy_support::client()
        .get(format!("http://{}/healthz", proxy.running.addr()))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
    let health = client.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

/// A client that does not trust the certificate is refused by its own TLS check: the
/// listener really presents the configured certificate.
#[tokio::test]
async fn a_client_without_the_ca_refuses_the_certificate() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("x")]))
        .await
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(keys.path());
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.server.tls_cert = cert;
        c.server.tls_key = key;
    })
    .await;
    let untrusting = reqwest::Client::builder()
        .tls_built_in_root_certs(true)
        .build()
        .unwrap();
    let error = untrusting
        .get(proxy.url("/healthz"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
}

#[tokio::test]
async fn a_certificate_that_cannot_be_used_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(dir.path());
    let missing = dir.path().join("missing.pem").display().to_string();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let not_pem = not_pem.display().to_string();
    for (tls_cert, tls_key, names, says) in [
        (
            missing.as_str(),
            key.as_str(),
            "server.tls_cert",
            "cannot read",
        ),
        (
            not_pem.as_str(),
            key.as_str(),
            "server.tls_cert",
            "no certificate",
        ),
        (
            cert.as_str(),
            missing.as_str(),
            "server.tls_key",
            "cannot read",
        ),
        // The certificate given as its own key.
        (
            cert.as_str(),
            cert.as_str(),
            "server.tls_key",
            "private key",
        ),
        (cert.as_str(), "", "server.tls_key", "set together"),
        ("", key.as_str(), "server.tls_cert", "set together"),
    ] {
        let config = dir.path().join("loopwarden.toml");
        std::fs::write(
            &config,
            format!("[server]\ntls_cert = {tls_cert:?}\ntls_key = {tls_key:?}\n"),
        )
        .unwrap();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tls_cert} / {tls_key}: {stderr}");
        assert!(
            stderr.contains(names) && stderr.contains(says),
            "{tls_cert} / {tls_key}: {stderr}"
        );
    }
}

/// The handshake runs under the same limits as a plain request head: a client that starts
/// one and stops halfway is closed at `server.header_timeout_secs`, and the listener goes
/// on serving.
#[tokio::test]
async fn a_handshake_that_stops_halfway_is_closed_at_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("x")]))
        .await
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(keys.path());
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.server.tls_cert = cert;
        c.server.tls_key = key;
        c.server.header_timeout_secs = 1;
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    // A handshake record's header announcing 512 bytes, and nothing more.
    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    let closed = async {
        let mut buf = [0u8; 256];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    // A bound on waiting (the timeout is 1 s), not a measurement.
    tokio::time::timeout(std::time::Duration::from_secs(30), closed)
        .await
        .expect("the half-done handshake is closed");
    let health = https_client()
        .get(proxy.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}
