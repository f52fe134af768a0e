//! The link's choice of protocol against a stand-in controller on a real socket: the
//! offer is taken from an answer's header, and an exchange refused with `404` sends the
//! node back to the two routes for good.

use super::*;
use crate::daemon::shared::Shared;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Answers every request with `answer(request line)`: (status line, extra headers, body).
async fn stand_in(answer: fn(&str) -> (&'static str, &'static str, &'static str)) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let exchanges = Arc::new(AtomicUsize::new(0));
    let seen = exchanges.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 8192];
                loop {
                    let Ok(n) = sock.read(&mut tmp).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    buf.drain(..end + 4 + len);
                    let line = head.lines().next().unwrap_or("").to_string();
                    if line.contains(fleet_api::protocol::EXCHANGE_PATH) {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    let (status, headers, body) = answer(&line);
                    let out = format!("HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n{body}", body.len());
                    if sock.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, exchanges)
}

fn link(url: &str, dir: &std::path::Path) -> (Link, DesiredTx) {
    let yaml = format!(
        "controllerUrl: {url}\nname: w1\ncapacity: {{slots: 1}}\nexecutors: {{k: {{image: img:1}}}}\nstateDir: {}\nsecretsDir: {}\nobserveSeconds: 5\n",
        dir.join("state").display(),
        dir.join("secrets").display()
    );
    let cfg = Arc::new(NodeConfig::parse(&yaml, "node.yaml", &|_| None).unwrap());
    let (secret_key, public_key) = fleet_api::seal::generate_keypair();
    let identity = Arc::new(Identity { node_id: "n1".into(), token: "fnt_x".into(), secret_key, public_key });
    let link = Link {
        client: Client::new(url, None).unwrap(),
        state: StateDir::open(&cfg.state_dir).unwrap(),
        reporter: Reporter::new(cfg.clone(), Arc::new(Shared::default())),
        identity,
        cfg,
    };
    (link, watch::channel(None).0)
}

const DESIRED: &str = r#"{"generation":4,"agents":[]}"#;
const OFFER: &str = "fleet-node-exchange: /api/v1/nodes/me/exchange\r\n";

#[tokio::test]
async fn the_offer_is_taken_and_a_refused_exchange_declines_it() {
    // A controller that offers the exchange but answers it 404 (a proxy that does not
    // pass the route): the node tries it once, then keeps to the two routes.
    let (url, exchanges) = stand_in(|line| {
        if line.starts_with("POST /api/v1/nodes/me/exchange") {
            ("404 Not Found", OFFER, r#"{"error":"not_found","message":"no such route"}"#)
        } else if line.starts_with("GET /api/v1/nodes/me/desired") {
            ("200 OK", OFFER, DESIRED)
        } else {
            ("204 No Content", OFFER, "")
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (link, tx) = link(&url, dir.path());
    assert_eq!(link.client.offer(), Offer::Unknown);
    let (fatal, _rx) = mpsc::channel(1);
    let mut rx = tx.subscribe();
    tokio::spawn(link.run(tx, fatal));
    // The pull loop gets the desired state and sees the offer; the exchange is refused.
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|d| d.as_ref().is_some_and(|d| d.generation == 4)))
        .await
        .expect("the desired state arrives")
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(exchanges.load(Ordering::SeqCst), 1, "tried once, then the two routes for good");
}

#[tokio::test]
async fn an_offered_exchange_carries_reports_and_the_desired_state() {
    let (url, exchanges) = stand_in(|line| {
        if line.starts_with("POST /api/v1/nodes/me/exchange") && !line.contains("since=4") {
            ("200 OK", OFFER, DESIRED)
        } else if line.starts_with("POST /api/v1/nodes/me/exchange") {
            ("304 Not Modified", OFFER, "")
        } else {
            ("200 OK", OFFER, DESIRED)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (link, tx) = link(&url, dir.path());
    let (fatal, _rx) = mpsc::channel(1);
    let mut rx = tx.subscribe();
    tokio::spawn(link.run(tx, fatal));
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|d| d.is_some())).await.unwrap().unwrap();
    // After the first answer it asks with since=4, and the stand-in answers 304 at once:
    // one exchange after another.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(exchanges.load(Ordering::SeqCst) >= 3, "the node speaks the exchange");
    assert!(dir.path().join("state/desired.json").exists(), "the desired state is saved");
}

/// A controller whose store does not know the node (`node_unknown`): the link keeps going —
/// no reason to end the process is sent — while a deleted node's `node_token_invalid` ends it
/// (docs/behaviour.md#a-store-older-than-the-fleet).
#[tokio::test]
async fn an_unknown_node_keeps_running_and_a_deleted_one_stops() {
    let (unknown, _) = stand_in(|_| {
        (
            "401 Unauthorized",
            OFFER,
            r#"{"error":"node_unknown","message":"this controller's store does not know this node"}"#,
        )
    })
    .await;
    let (deleted, _) = stand_in(|_| {
        (
            "401 Unauthorized",
            OFFER,
            r#"{"error":"node_token_invalid","message":"the node token is missing, unknown or revoked"}"#,
        )
    })
    .await;
    for (url, ends) in [(unknown, false), (deleted, true)] {
        let dir = tempfile::tempdir().unwrap();
        let (link, tx) = link(&url, dir.path());
        let (fatal, mut reasons) = mpsc::channel(1);
        let task = tokio::spawn(link.run(tx, fatal));
        let said = tokio::time::timeout(Duration::from_secs(3), reasons.recv()).await;
        match said {
            Ok(Some(Fatal(m))) => assert!(ends && m == CREDENTIAL_REJECTED, "{url}: {m}"),
            _ => assert!(!ends && !task.is_finished(), "{url}: the link must go on"),
        }
        task.abort();
    }
}

#[test]
fn a_node_unknown_answer_is_told_apart_from_a_rejected_credential() {
    // The words the node logs name the cause and the fix.
    assert!(NODE_UNKNOWN.contains("restored from a backup") && NODE_UNKNOWN.contains("new join key"));
    assert!(NODE_UNKNOWN.contains("agents keep running"));
}
