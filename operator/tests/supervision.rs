//! Supervision (docs/behaviour.md#hardening) and readiness (docs/behaviour.md#high-availability) of the real controller binary: a core
//! task that ends takes the process down non-zero with a log line naming it, for each kind of
//! core task; `/readyz` turns 503 while passes stop and 200 again when they resume. Tasks are
//! ended and passes stalled through the test-only failpoints (`FLEET_FAILPOINTS`).

mod support;

use std::time::{Duration, Instant};
use support::*;

/// Waits for the child to exit and returns its exit code.
async fn exit_code(ctl: &mut ControllerProcess, secs: u64) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = ctl.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "the controller is still running; log:\n{}", ctl.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_task_that_ends_takes_the_controller_down_naming_it() {
    let dk = devkit().await;
    for task in ["pass", "worker", "rotations", "writer", "cp-watcher", "report-flusher", "api-listener"] {
        let dir = tempfile::tempdir().unwrap();
        let points = dir.path().join("failpoints");
        std::fs::create_dir(&points).unwrap();
        let mut env = env_for(&dk, dir.path(), free_port(), free_port());
        env.insert("FLEET_FAILPOINTS".into(), points.display().to_string());
        let mut ctl = ControllerProcess::spawn(env, dir.path().join("c.log")).await;
        assert!(ctl.child.try_wait().unwrap().is_none(), "runs while every task runs");
        std::fs::write(points.join(format!("end-{task}")), "").unwrap();
        let code = exit_code(&mut ctl, 20).await;
        assert_eq!(code, Some(1), "{task}: exits non-zero");
        let log = ctl.log_text();
        let line = format!("the {task} task ended; exiting so that the orchestrator restarts the controller");
        assert!(log.contains(&line), "{task}: the log names it:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_while_passes_stop_and_200_when_they_resume() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let points = dir.path().join("failpoints");
    std::fs::create_dir(&points).unwrap();
    let mut env = env_for(&dk, dir.path(), free_port(), free_port());
    env.insert("FLEET_FAILPOINTS".into(), points.display().to_string());
    // Passes every second: ready while the last finished within 3 × 1 + 30 s.
    env.insert("FLEET_RECONCILE_SECONDS".into(), "1".into());
    let ctl = ControllerProcess::spawn(env, dir.path().join("c.log")).await;
    let http = reqwest::Client::new();
    let readyz = || async {
        let r = http.get(format!("{}/readyz", ctl.url)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    };
    eventually(10, "ready after the first pass", || async { (readyz().await.0 == 200).then_some(()) }).await;

    std::fs::write(points.join("stall-pass"), "").unwrap();
    let stalled = Instant::now();
    let (_, body) = eventually(60, "503 once passes stopped for 33 s", || async {
        let (status, body) = readyz().await;
        (status == 503).then_some(((), body))
    })
    .await;
    assert!(stalled.elapsed() >= Duration::from_secs(30), "not before the limit: {:?}", stalled.elapsed());
    assert_eq!(body["error"], "not_ready");
    let message = body["message"].as_str().unwrap();
    assert!(message.starts_with("the last reconcile pass finished ") && message.ends_with("(limit 33s)"), "{message}");
    let (status, _) = (http.get(format!("{}/healthz", ctl.url)).send().await.unwrap().status(), ());
    assert_eq!(status, 200, "liveness is not readiness: /healthz still answers");

    std::fs::remove_file(points.join("stall-pass")).unwrap();
    eventually(10, "200 again once passes resume", || async { (readyz().await.0 == 200).then_some(()) }).await;
}
