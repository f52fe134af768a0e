//! Agent identity and PATs (docs/behaviour.md#iam-calls, docs/behaviour.md#identity-and-pats) with the controller as a real process: the
//! right audiences and scopes, sealed to one node, revoked on stop, rotated before expiry,
//! an IAM outage that blocks only new agents, exactly one live PAT after a `SIGKILL` between
//! issuing and storing, and no plaintext PAT in the store or the logs.

mod support;

use fleet_devkit::Faults;
use serde_json::{json, Value};
use support::*;

fn cred_of(desired: &Value, agent: &str) -> Option<String> {
    desired["agents"]
        .as_array()?
        .iter()
        .find(|a| a["agentKey"] == agent)
        .and_then(|a| a["identity"]["credential"]["credentialId"].as_str())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pats_are_scoped_sealed_rotated_revoked_and_idempotent() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = env_for(&dk, dir.path(), free_port(), free_port());
    env.insert("FLEET_TOKEN_REVOKE_GRACE_SECONDS".into(), "2".into());
    let log = dir.path().join("controller.log");
    let mut ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut a = TestNode::new(&ctl.url, "n-a", json!({"executorKinds": ["k"], "capacity": {"slots": 10}}));
    let mut b = TestNode::new(&ctl.url, "n-b", json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
    a.join(&admin.join_key().await).await;
    b.join(&admin.join_key().await).await;
    let reporter = keep_reporting(vec![a.clone(), b.clone()]);

    // Audiences and scopes per docs/behaviour.md#identity-and-pats; sealed to n-a only.
    let mut scoped = agent("scoped", "k", 1);
    scoped["identity"]["iam"] = json!({"audiences": ["notification-service", "billing"]});
    scoped["drainSeconds"] = json!(1);
    dk.put_agent(scoped);
    let d = eventually(20, "scoped's PAT in n-a's desired state", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "scoped").map(|_| d)
    })
    .await;
    let pat = a.open_pat(&d, "scoped").expect("opens with n-a's key");
    assert!(b.open_pat(&d, "scoped").is_none(), "no other key opens it");
    let rec = dk.pats().into_iter().find(|p| p.token == pat).expect("IAM issued it");
    assert_eq!(rec.audiences, ["control-plane", "notification-service"]);
    assert_eq!(rec.scope_ceiling, ["control-plane:read", "notification-service=notifications:send"]);
    assert_eq!(rec.idempotency_key, format!("fleet-pat-scoped-{}-0", a.id));
    assert_eq!(rec.expires_in_seconds, 604_800);
    assert_eq!(d["agents"][0]["identity"]["principalId"], rec.principal_id.as_str());
    assert_eq!(dk.identity("scoped").unwrap()["iamPrincipalId"], rec.principal_id.as_str());

    // Stopping the agent revokes its PAT once the node's 30 s stop has run (docs/behaviour.md#identity-and-pats;
    // `revocation.rs` holds the timing).
    dk.edit_agent("scoped", |v| v["state"] = json!("stopped"));
    eventually(45, "stopped agent's PAT revoked", || async {
        dk.pats().iter().any(|p| p.token == pat && p.revoked).then_some(())
    })
    .await;
    let (_, d) = a.desired(None, 0).await;
    assert!(cred_of(&d, "scoped").is_none(), "a stopped agent leaves the desired state");

    // IAM grants a short lifetime: the PAT is rotated before expiry, the node gets the new
    // one, and the old one is revoked after the (shortened) grace.
    dk.set_faults(Faults { pat_lifetime_seconds: Some(9), ..Default::default() });
    dk.put_agent(agent("rot", "k", 1));
    let first = eventually(20, "rot's first PAT", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "rot")
    })
    .await;
    let second = eventually(30, "rot's PAT rotated", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "rot").filter(|c| *c != first)
    })
    .await;
    dk.set_faults(Faults::default());
    eventually(20, "the rotated PAT revoked after the grace", || async {
        dk.pats().iter().any(|p| p.id == first && p.revoked).then_some(())
    })
    .await;
    assert!(dk.pats().iter().any(|p| p.id == second && !p.revoked));
    // Each new PAT of a pair gets the next counter, so it never replays the one it replaces.
    let key_of = |id: &str| dk.pats().into_iter().find(|p| p.id == id).map(|p| p.idempotency_key).unwrap();
    assert_eq!(key_of(&first), format!("fleet-pat-rot-{}-0", a.id));
    assert_eq!(key_of(&second), format!("fleet-pat-rot-{}-1", a.id));

    // IAM down: a new agent waits with identity_pending; running ones keep their PATs.
    dk.put_agent(agent("kept", "k", 1));
    let kept = eventually(20, "kept's PAT", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "kept")
    })
    .await;
    dk.set_faults(Faults { iam_down: true, ..Default::default() });
    dk.put_agent(agent("late", "k", 1));
    let st = eventually(20, "late is identity_pending in the CP", || async {
        dk.status("late").filter(|s| s["reason"]["message"].as_str().is_some_and(|m| m.contains("IAM answered 503")))
    })
    .await;
    assert_eq!(
        (st["phase"].as_str(), st["reason"]["code"].as_str()),
        (Some("pending"), Some("identity_pending")),
        "{st}"
    );
    let (_, d) = a.desired(None, 0).await;
    assert_eq!(cred_of(&d, "kept"), Some(kept.clone()), "running agents keep their credentials");
    dk.set_faults(Faults::default());
    eventually(40, "late converges once IAM is back", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "late")
    })
    .await;
    eventually(20, "late leaves identity_pending", || async {
        dk.status("late").filter(|s| s["reason"]["code"] != "identity_pending")
    })
    .await;
    // The failed attempts did not use up counters: late's first PAT is its pair's n = 0.
    let late: Vec<_> = dk.pats().into_iter().filter(|p| p.agent_key.as_deref() == Some("late")).collect();
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(
        late[0].idempotency_key.starts_with("fleet-pat-late-") && late[0].idempotency_key.ends_with("-0"),
        "{late:?}"
    );

    // SIGKILL between IAM issuing a PAT and the controller storing it: the restart replays
    // the same Idempotency-Key and exactly one live PAT exists for the placement.
    dk.set_faults(Faults { pat_answer_delay_ms: 5000, ..Default::default() });
    dk.put_agent(agent("crash", "k", 1));
    eventually(20, "IAM recorded crash's PAT", || async {
        dk.pats().iter().any(|p| p.agent_key.as_deref() == Some("crash")).then_some(())
    })
    .await;
    ctl.kill9();
    dk.set_faults(Faults::default());
    let ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let cred = eventually(30, "crash's PAT delivered after the restart", || async {
        let (_, d) = a.desired(None, 0).await;
        cred_of(&d, "crash")
    })
    .await;
    let live: Vec<_> =
        dk.pats().into_iter().filter(|p| p.agent_key.as_deref() == Some("crash") && !p.revoked).collect();
    assert_eq!(live.len(), 1, "exactly one live PAT: {live:?}");
    assert_eq!(live[0].id, cred);
    assert!(dk.calls("issue_pat_replay") >= 1, "the retry replayed the idempotency key");

    // No plaintext PAT in the store's files or the controller's log.
    reporter.abort();
    drop(ctl);
    let mut files: Vec<(String, Vec<u8>)> = vec![("log".into(), std::fs::read(&log).unwrap())];
    for f in ["fleet.sqlite", "fleet.sqlite-wal", "fleet.sqlite-shm"] {
        if let Ok(bytes) = std::fs::read(dir.path().join(f)) {
            files.push((f.into(), bytes));
        }
    }
    let pats = dk.pats();
    assert!(pats.len() >= 5);
    for p in &pats {
        for (name, bytes) in &files {
            assert!(!bytes.windows(p.token.len()).any(|w| w == p.token.as_bytes()), "PAT in clear in {name}");
        }
    }
}
