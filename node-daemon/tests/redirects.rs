//! A controller URL that redirects elsewhere (docs/behaviour.md#hardening): a `307` to another
//! host would make fleet-node re-post its join key there. The node follows a redirect only to
//! the controller's own scheme, host and port: the other host hears nothing, and the node's log
//! says why it cannot join.

use fleet_devkit::redirects::{redirector, trap};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_join_key_is_never_posted_to_a_redirect_elsewhere() {
    let (elsewhere, heard) = trap().await;
    let controller = redirector(elsewhere).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("secrets")).unwrap();
    std::fs::write(d.join("join-key"), "fjk_the-secret-key").unwrap();
    let yaml = format!(
        "controllerUrl: {controller}\nname: redirected\ncapacity: {{slots: 1}}\nexecutors:\n  k: {{image: \"a:1\"}}\n\
         stateDir: {s}/state\nsecretsDir: {s}/secrets\njoinKeyFile: {s}/join-key\ndockerUrl: tcp://127.0.0.1:1\n",
        s = d.display()
    );
    std::fs::write(d.join("node.yaml"), yaml).unwrap();
    let log = d.join("node.log");
    let mut node = Command::new(env!("CARGO_BIN_EXE_fleet-node"))
        .args(["--config", &d.join("node.yaml").display().to_string()])
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("is refused: only the controller's own scheme, host and port") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = node.kill();
    let _ = node.wait();
    assert!(text.contains("is refused: only the controller's own scheme, host and port"), "{text}");
    assert_eq!(heard.load(Ordering::SeqCst), 0, "the join key went elsewhere:\n{text}");
}
