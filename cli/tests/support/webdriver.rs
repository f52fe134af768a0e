//! A WebDriver client over plain HTTP (W3C WebDriver, as chromedriver speaks it): enough to
//! drive Debian's headless Chromium through the web view. No client crate: the protocol is a
//! handful of JSON calls.

use base64::Engine;
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ELEMENT: &str = "element-6066-11e4-a5c6-90f8d9e6b0b3";

/// chromedriver and Chromium, when both are installed.
pub fn browser_paths() -> Option<(String, String)> {
    let find =
        |names: &[&str]| names.iter().map(|n| format!("/usr/bin/{n}")).find(|p| std::path::Path::new(p).exists());
    Some((find(&["chromedriver"])?, find(&["chromium", "chromium-browser", "google-chrome"])?))
}

/// [`browser_paths`], or `None` after saying the test is skipped; with `FLEET_E2E=1` a
/// missing browser fails the test instead.
pub fn browser_or_skip() -> Option<(String, String)> {
    let found = browser_paths();
    if found.is_none() {
        let msg = "chromium and chromium-driver are not installed: apt-get install chromium chromium-driver";
        assert!(std::env::var("FLEET_E2E").as_deref() != Ok("1"), "{msg}");
        eprintln!("SKIPPED the browser test: {msg}");
    }
    found
}

pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    url: String,
}

impl Browser {
    pub async fn start(driver: &str, chromium: &str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let t = Instant::now();
        while http.get(format!("{url}/status")).send().await.is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "chromedriver did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"]}}}});
        let v: Value = http.post(format!("{url}/session")).json(&caps).send().await.unwrap().json().await.unwrap();
        let session = v["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
        Browser { driver: child, http, session, url }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let u = format!("{}/session/{}{path}", self.url, self.session);
        let mut req = self.http.request(method, u);
        if !body.is_null() {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        if v["value"].get("error").is_some() {
            panic!("webdriver {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({ "url": url })).await;
    }

    pub async fn js(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", json!({"script": script, "args": []})).await
    }

    async fn element(&self, css: &str) -> String {
        let v = self.call(reqwest::Method::POST, "/element", json!({"using": "css selector", "value": css})).await;
        // The W3C key, or the one this chromedriver uses: the object's only value.
        let id = v.get(ELEMENT).or_else(|| v.as_object().and_then(|o| o.values().next()));
        id.and_then(Value::as_str).unwrap_or_else(|| panic!("no element {css}: {v}")).to_string()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{e}/value"), json!({ "text": text })).await;
    }

    pub async fn click(&self, css: &str) {
        let e = self.element(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{e}/click"), json!({})).await;
    }

    /// The page's visible text of `css`.
    pub async fn text(&self, css: &str) -> String {
        let script = format!("const e = document.querySelector({css:?}); return e ? e.innerText : '';");
        self.js(&script).await.as_str().unwrap_or_default().to_string()
    }

    /// Waits until the text of `css` contains every one of `needles`; returns it.
    pub async fn wait_text(&self, css: &str, needles: &[&str], secs: u64) -> String {
        let t = Instant::now();
        loop {
            let text = self.text(css).await;
            if needles.iter().all(|n| text.contains(n)) {
                return text;
            }
            assert!(t.elapsed() < Duration::from_secs(secs), "{needles:?} not in {css} after {secs}s:\n{text}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn screenshot(&self, path: &std::path::Path) {
        let v = self.call(reqwest::Method::GET, "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
