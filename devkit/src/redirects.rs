//! Peers that redirect elsewhere, for the tests of every outbound client's redirect policy
//! (docs/behaviour.md#hardening): a trap on another address that counts who reaches it, and a
//! server that answers everything `307` to it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A listener on 127.0.0.2 (another host to a client) that counts the connections it gets and
/// answers each `200`: its URL and the count.
pub async fn trap() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.expect("bind 127.0.0.2");
    let url = format!("http://{}", l.local_addr().expect("the trap's address"));
    let heard = Arc::new(AtomicUsize::new(0));
    let count = heard.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    (url, heard)
}

/// A server on 127.0.0.1 answering every request `307` to `to` plus the request's path: its URL.
pub async fn redirector(to: String) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let url = format!("http://{}", l.local_addr().expect("the redirector's address"));
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(redirect(s, to.clone()));
        }
    });
    url
}

/// Reads one request head and answers it `307` to `to` plus its path.
async fn redirect(mut s: tokio::net::TcpStream, to: String) {
    let mut buf = vec![0u8; 65536];
    let n = s.read(&mut buf).await.unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let answer = format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: {to}{path}\r\ncontent-length: 0\r\n\r\n");
    let _ = s.write_all(answer.as_bytes()).await;
}
