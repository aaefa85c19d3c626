//! A small WebDriver client for the dashboard's browser tests: spawns `chromedriver` and
//! speaks its HTTP JSON protocol (W3C WebDriver) to one headless Chromium session.
//!
//! The tests that use it are `#[ignore]`d, so that a plain `cargo test` counts them as
//! ignored rather than passed where Chromium is absent; run (`cargo test --
//! --include-ignored`, as `.ci/run` does after installing Debian's `chromium` and
//! `chromium-driver`), a missing browser fails them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    /// Removed when the browser is dropped.
    _profile: tempfile::TempDir,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

impl Browser {
    /// A fresh headless Chromium; fails the test when it is not installed.
    pub async fn start() -> Browser {
        let driver = find_binary(&["chromedriver"]);
        let chromium = find_binary(&["chromium", "chromium-browser", "google-chrome"]);
        let (Some(driver), Some(chromium)) = (driver, chromium) else {
            panic!(
                "this test needs chromium and chromedriver (apt-get install -y chromium chromium-driver)"
            );
        };
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let mut ready = false;
        for _ in 0..200 {
            if let Ok(r) = http.get(format!("{base}/status")).send().await {
                let bytes = r.bytes().await.unwrap_or_default();
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                if v["value"]["ready"] == true {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ready, "chromedriver did not start");
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let answer = http
            .post(format!("{base}/session"))
            .header("content-type", "application/json")
            .body(caps.to_string())
            .send()
            .await
            .unwrap();
        let r: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {r}"))
            .to_string();
        Browser {
            driver: child,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if let Some(b) = body {
            request = request
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let bytes = request.send().await.unwrap().bytes().await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn goto(&self, url: &str) {
        let v = self.post("/url", json!({ "url": url })).await;
        assert!(v.is_null(), "navigate to {url}: {v}");
    }

    pub async fn url(&self) -> String {
        let v = self.call(reqwest::Method::GET, "/url", None).await;
        v.as_str().unwrap_or_default().to_string()
    }

    pub async fn source(&self) -> String {
        let v = self.call(reqwest::Method::GET, "/source", None).await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// Every element matching the CSS selector, now.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let v = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        v.as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (polling, up to 20 s) until `css` matches an element whose text contains
    /// `text` (any element when `text` is empty); panics with the page otherwise.
    pub async fn wait_for(&self, css: &str, text: &str) -> Element {
        for _ in 0..400 {
            for e in self.find_all(css).await {
                if text.is_empty() || self.text(&e).await.contains(text) {
                    return e;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no {css:?} with {text:?} on {}:\n{}",
            self.url().await,
            self.body_text().await
        );
    }

    /// Waits until the page's script says `expression` is true.
    pub async fn wait_until(&self, expression: &str) {
        for _ in 0..400 {
            if self.eval(expression).await == Value::Bool(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "never true: {expression} on {}:\n{}",
            self.url().await,
            self.body_text().await
        );
    }

    pub async fn body_text(&self) -> String {
        self.eval("document.body ? document.body.innerText : ''")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The value of a JavaScript expression on the page.
    pub async fn eval(&self, expression: &str) -> Value {
        self.post(
            "/execute/sync",
            json!({"script": format!("return ({expression});"), "args": []}),
        )
        .await
    }

    pub async fn text(&self, e: &Element) -> String {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!("/element/{}/text", e.0),
                None,
            )
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// The first element matching `css` inside `e`.
    pub async fn find_in(&self, e: &Element, css: &str) -> Option<Element> {
        let v = self
            .post(
                &format!("/element/{}/element", e.0),
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT].as_str().map(|s| Element(s.to_string()))
    }

    pub async fn click(&self, e: &Element) {
        let v = self
            .post(&format!("/element/{}/click", e.0), json!({}))
            .await;
        assert!(v.is_null(), "click: {v}");
    }

    /// Clicks the element matching `css` whose text contains `text`, found again when
    /// the page redrew it between the look-up and the click (the views poll and redraw).
    pub async fn click_on(&self, css: &str, text: &str) {
        for _ in 0..50 {
            let e = self.wait_for(css, text).await;
            let v = self
                .post(&format!("/element/{}/click", e.0), json!({}))
                .await;
            if v.is_null() {
                return;
            }
            assert_eq!(v["error"], "stale element reference", "click {css}: {v}");
        }
        panic!("{css} kept being redrawn");
    }

    pub async fn type_into(&self, e: &Element, text: &str) {
        let v = self
            .post(&format!("/element/{}/value", e.0), json!({ "text": text }))
            .await;
        assert!(v.is_null(), "type: {v}");
    }

    /// Saves a PNG of the window as `dir/name.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64_decode(v.as_str().unwrap_or_default());
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// Where screenshots go: `$LW_UI_SCREENSHOTS`, else `ui-screenshots/` in the target dir.
pub fn screenshot_dir() -> PathBuf {
    match std::env::var_os("LW_UI_SCREENSHOTS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap_or(Path::new("target"))
            .join("ui-screenshots"),
    }
}

/// Standard base64 (what WebDriver screenshots are), decoded.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, d) in chunk.iter().enumerate() {
            n |= u32::from(*d) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (Chromium exits) with a plain blocking DELETE, then stops the
        // driver: both are this test's own processes.
        use std::io::{Read, Write};
        let addr = self.base.trim_start_matches("http://").to_string();
        if let Ok(mut stream) = std::net::TcpStream::connect(&addr) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let request = format!(
                "DELETE /session/{} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n",
                self.session
            );
            let _ = stream.write_all(request.as_bytes());
            let _ = stream.read_to_end(&mut Vec::new());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
