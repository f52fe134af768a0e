//! `fleetctl` as an admin runs it: the real binary against a dev controller
//! (`fleet_controller::dev::start`, the code behind `fleet-controller dev`) with a node joined
//! over HTTP: each command's table and JSON, the lifecycle commands, and the messages for
//! 401, 403, 503, a missing token and an unknown node.

mod support;

use base64::Engine as _;
use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_against_a_dev_controller() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, ctl) = dev_fleet(dir.path()).await;
    let _a = join_node(&ctl.url, &fleet.join_key, "node-a", 4).await;

    // join-key prints the key alone on stdout.
    let key = ctl.ok(&["join-key", "--ttl", "600", "--note", "second"]);
    assert!(key.trim().starts_with("fjk_") && key.lines().count() == 1, "{key}");
    let _b = join_node(&ctl.url, key.trim(), "node-b", 4).await;

    // The dev agents (coder 1 replica, reviewer 2) get placed.
    let c = &ctl;
    eventually("three replicas placed", || c.ok(&["placements"]).matches("placed").count() >= 2).await;
    let nodes = ctl.ok(&["nodes"]);
    let header = nodes.lines().next().unwrap();
    assert!(header.starts_with("NAME     STATUS   HEALTH   SCHEDULING    SLOTS   VERSION   LAST SEEN"), "{nodes}");
    assert!(
        nodes.lines().any(|l| l.starts_with("node-a") && l.contains("online") && l.contains("schedulable")),
        "{nodes}"
    );
    let wide = ctl.ok(&["nodes", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().ends_with("ID   KINDS   LABELS") || wide.contains("KINDS"), "{wide}");
    assert!(wide.contains("claude-code") && wide.contains("zone=eu"), "{wide}");
    let json: Value = serde_json::from_str(&ctl.ok(&["nodes", "-o", "json"])).unwrap();
    assert_eq!(json["items"].as_array().unwrap().len(), 2);

    let node = ctl.ok(&["node", "node-a"]);
    assert!(node.starts_with("Name:       node-a\n"), "{node}");
    assert!(node.contains("Scheduling: schedulable") && node.contains("AGENT"), "{node}");
    let placements = ctl.ok(&["placements"]);
    assert!(
        placements.starts_with("AGENT") && placements.contains("reviewer") && placements.contains("node-"),
        "{placements}"
    );
    let pj: Value = serde_json::from_str(&ctl.ok(&["placements", "-o", "json"])).unwrap();
    assert!(pj["items"].as_array().unwrap().iter().any(|p| p["agentKey"] == "coder"));

    let why = ctl.ok(&["why", "reviewer", "--nodes"]);
    assert!(why.starts_with("Agent:      reviewer (revision 1)\n"), "{why}");
    assert!(why.contains("FILTER") && why.contains("online") && why.contains("capacity"), "{why}");
    assert!(why.contains("NODE     FITS"), "{why}");
    let wj: Value = serde_json::from_str(&ctl.ok(&["why", "reviewer", "-o", "json"])).unwrap();
    assert_eq!(wj["desiredReplicas"], 2);
    // The dev example coder has a priority (docs/behaviour.md#spread-and-priority).
    assert!(ctl.ok(&["why", "coder"]).contains("\nPriority:   10\n"));

    // A reader that goes away (`fleetctl why … | head -1`): the end of a piped tool, no panic.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .env("FLEET_URL", &ctl.url)
        .env("FLEET_TOKEN", &ctl.token)
        .args(["why", "reviewer", "--nodes"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let closed = child.wait_with_output().unwrap();
    assert_eq!(closed.status.code(), Some(141), "{}", text(&closed.stderr));
    assert!(!text(&closed.stderr).contains("panicked"), "{}", text(&closed.stderr));

    // Lifecycle.
    assert_eq!(ctl.ok(&["cordon", "node-a"]), "node node-a cordoned\n");
    assert!(ctl.ok(&["nodes"]).lines().any(|l| l.starts_with("node-a") && l.contains("cordoned")));
    assert_eq!(ctl.ok(&["uncordon", "node-a"]), "node node-a uncordoned\n");
    let drain = ctl.run(&["drain", "node-a", "--wait", "--timeout", "30"]);
    assert!(drain.status.success(), "{}", text(&drain.stderr));
    assert!(text(&drain.stdout).ends_with("node node-a drained\n"), "{}", text(&drain.stdout));
    assert!(text(&drain.stderr).contains("draining node-a: "), "the progress line: {}", text(&drain.stderr));
    assert!(ctl.ok(&["nodes"]).lines().any(|l| l.starts_with("node-a") && l.contains("drained")));

    // Delete asks; without a terminal and without --yes it refuses.
    let e = ctl.fails(Some(&ctl.token), &["delete", "node-a"]);
    assert!(e.contains("pass --yes"), "{e}");
    assert_eq!(ctl.ok(&["delete", "node-a", "--yes"]), "node node-a deleted\n");
    assert!(!ctl.ok(&["nodes"]).contains("node-a"));

    // Events, oldest first, and as JSON lines.
    let c = &ctl;
    eventually("the deletion in the events", || c.ok(&["events", "--node", "node-a"]).contains("node_deleted")).await;
    let events = ctl.ok(&["events", "--node", "node-a"]);
    assert!(events.starts_with("SEQ"), "{events}");
    let kinds: Vec<&str> = events.lines().skip(1).filter_map(|l| l.split_whitespace().nth(2)).collect();
    let pos = |k: &str| kinds.iter().position(|x| *x == k).unwrap_or_else(|| panic!("{k} in {kinds:?}"));
    assert!(pos("node_joined") < pos("node_cordoned") && pos("node_draining") < pos("node_deleted"), "{kinds:?}");
    let first: Value = serde_json::from_str(ctl.ok(&["events", "-o", "json"]).lines().next().unwrap()).unwrap();
    assert!(first["seq"].as_i64().unwrap() >= 1);

    // Past 50 events, `fleetctl events` opens at the newest: the last 50, the newest at the
    // bottom, and says how to see more; `--all` and `--since` read on from older ones.
    for _ in 0..30 {
        ctl.ok(&["cordon", "node-b"]);
        ctl.ok(&["uncordon", "node-b"]);
    }
    let seqs = |out: &str| -> Vec<i64> {
        out.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_i64().unwrap()).collect()
    };
    let written = || seqs(&c.ok(&["events", "--all", "-o", "json"])).len() >= 60 + kinds.len();
    eventually("the 60 lifecycle events written", written).await;
    let all = seqs(&ctl.ok(&["events", "--all", "-o", "json"]));
    assert!(all.windows(2).all(|w| w[0] < w[1]), "--all: oldest first");
    let last = ctl.run(&["events"]);
    let (stdout, stderr) = (text(&last.stdout), text(&last.stderr));
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 50, "{stdout}");
    assert!(rows[49].starts_with(&format!("{} ", all[all.len() - 1])), "the newest at the bottom: {stdout}");
    assert!(stderr.contains("(the last 50 events; --all shows every one kept"), "{stderr}");
    let tail = seqs(&ctl.ok(&["events", "-o", "json"]));
    assert_eq!(tail, all[all.len() - 50..], "the newest 50, oldest of them first");
    let after = seqs(&ctl.ok(&["events", "--since", &all[all.len() - 3].to_string(), "-o", "json"]));
    assert_eq!(after, all[all.len() - 2..]);

    // What goes wrong, and what to do about it.
    let e = ctl.fails(Some(&ctl.token), &["node", "nope"]);
    assert_eq!(e, "error: no node with id or name \"nope\" (not_found)\n");
    let e = ctl.fails(Some("not-a-jwt"), &["nodes"]);
    assert!(e.contains("(invalid_token) — the token was refused: it may be expired"), "{e}");
    let read_only = fleet.devkit.mint("fleet", &["fleet:read"], 600);
    assert!(ctl.run_with_token(Some(&read_only), &["nodes"]).status.success(), "fleet:read reads");
    let e = ctl.fails(Some(&read_only), &["cordon", "node-b"]);
    assert!(e.contains("(insufficient_scope) — the token lacks fleet:admin"), "{e}");
    let e = ctl.fails(None, &["nodes"]);
    assert!(e.contains("no token: set FLEET_TOKEN or pass --token"), "{e}");
    let gone = Ctl { url: "http://127.0.0.1:1".into(), token: ctl.token.clone() };
    let e = gone.fails(Some(&ctl.token), &["nodes"]);
    assert!(e.contains("cannot reach the controller at http://127.0.0.1:1") && e.contains("FLEET_URL"), "{e}");
    fleet.controller.shutdown().await;
}

/// A controller without a service account answers 503: fleetctl says which settings it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_without_credentials_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("FLEET_LISTEN", "127.0.0.1:0".to_string()),
        ("FLEET_METRICS_LISTEN", "127.0.0.1:0".to_string()),
        ("FLEET_DATA_DIR", dir.path().display().to_string()),
        ("FLEET_CONTROL_PLANE_URL", "http://127.0.0.1:1".to_string()),
        ("FLEET_IAM_URL", "http://127.0.0.1:1".to_string()),
        ("FLEET_IAM_ISSUER", "http://127.0.0.1:1".to_string()),
        ("FLEET_IAM_TENANT", "t".to_string()),
        ("FLEET_JWKS_URL", "http://127.0.0.1:1/jwks".to_string()),
    ];
    let cfg =
        fleet_controller::config::Config::from_lookup(&|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
            .unwrap();
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let ctl = Ctl { url: format!("http://{}", running.addr), token: "any".into() };
    let e = ctl.fails(Some("any"), &["nodes"]);
    assert!(e.contains("(not_configured) — the controller has no service account yet: set FLEET_CLIENT_ID"), "{e}");
    running.shutdown().await;
}

/// What fleetctl prints of what a node wrote has no terminal controls in it; the token comes
/// from a file or the environment, a `--token` warns, and plain http:// to another host is
/// refused before anything is sent (docs/reference.md#fleetctl); `dev`'s join-key file is `0600`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_and_token_hygiene() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, ctl) = dev_fleet(dir.path()).await;
    // `dev` writes the join key where only its user reads it.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("join-key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "join-key mode {mode:o}");
    let http = reqwest::Client::new();
    let (_, pk) = fleet_api::seal::generate_keypair();
    let body = serde_json::json!({
        "joinKey": fleet.join_key, "name": "node-x", "version": "0.1.0\u{1b}[2J\u{1b}]0;owned\u{7}",
        "publicKey": base64::engine::general_purpose::STANDARD.encode(pk),
        "labels": ["zone=eu"], "executorKinds": ["claude-code"], "capacity": {"slots": 1}, "secrets": [], "executorImages": {}
    });
    let r = http.post(format!("{}/api/v1/nodes:join", ctl.url)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let nodes = ctl.ok(&["nodes", "-o", "wide"]);
    assert!(nodes.contains("node-x"), "{nodes}");
    assert!(!nodes.contains('\u{1b}') && !nodes.contains('\u{7}'), "no escape reaches the terminal: {nodes:?}");
    assert!(nodes.contains("0.1.0\u{fffd}[2J"), "{nodes}");

    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{}\n", ctl.token)).unwrap();
    let from_file = ctl.run_with_token(None, &["nodes", "--token-file", token_file.to_str().unwrap()]);
    assert!(from_file.status.success() && from_file.stderr.is_empty(), "{}", text(&from_file.stderr));
    let on_line = ctl.run_with_token(None, &["nodes", "--token", &ctl.token]);
    assert!(on_line.status.success());
    assert!(
        text(&on_line.stderr).contains("warning: --token puts the token on the command line"),
        "{}",
        text(&on_line.stderr)
    );

    let far = Ctl { url: "http://192.0.2.10:8040".into(), token: ctl.token.clone() };
    let e = far.fails(Some(&ctl.token), &["nodes"]);
    assert!(e.starts_with("error: refusing to send the token over plain http:// to 192.0.2.10"), "{e}");
    let e = far.fails(Some(&ctl.token), &["nodes", "--insecure"]);
    assert!(e.contains("cannot reach the controller at http://192.0.2.10:8040"), "--insecure sends it: {e}");
    fleet.controller.shutdown().await;
}

/// docs/behaviour.md#what-a-node-may-claim: `fleetctl join-key --allow-label/--allow-kind` issues
/// a key whose node may claim only what matches; what it claims beyond is refused (the node
/// view, `fleetctl node`), and a bad pattern is refused by the controller, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_key_allowances_limit_what_the_node_may_claim() {
    let dir = tempfile::tempdir().unwrap();
    let (_fleet, ctl) = dev_fleet(dir.path()).await;
    let key = ctl.ok(&["join-key", "--allow-label", "zone=*", "--allow-kind", "observer"]);
    let _n = join_node(&ctl.url, key.trim(), "node-c", 2).await;
    let view: Value = serde_json::from_str(&ctl.ok(&["node", "node-c", "-o", "json"])).unwrap();
    assert_eq!(view["allowedLabels"], serde_json::json!(["zone=*"]), "{view}");
    assert_eq!(view["allowedKinds"], serde_json::json!(["observer"]), "{view}");
    assert_eq!(view["labels"], serde_json::json!(["zone=eu"]), "zone=eu matches zone=*: {view}");
    assert_eq!(view["executorKinds"], serde_json::json!([]), "claude-code is not allowed: {view}");
    assert_eq!(view["refusedFacts"], serde_json::json!({"labels": [], "kinds": ["claude-code"]}), "{view}");
    let text = ctl.ok(&["node", "node-c"]);
    assert!(text.contains("Refused:    kinds claude-code"), "{text}");

    // fleetctl allow replaces the allowance at once; no flag lifts every limit.
    let allowed = ctl.ok(&["allow", "node-c", "--label", "zone=*", "--kind", "observer", "--kind", "claude-code"]);
    assert_eq!(allowed, "node node-c may claim labels zone=*; kinds claude-code, observer\n");
    let view: Value = serde_json::from_str(&ctl.ok(&["node", "node-c", "-o", "json"])).unwrap();
    assert_eq!(view["executorKinds"], serde_json::json!(["claude-code"]), "{view}");
    let allowed = ctl.ok(&["allow", "node-c", "--label", "gpu"]);
    assert_eq!(allowed, "node node-c may claim labels gpu; kinds any\nrefused now: labels zone=eu\n");
    assert_eq!(ctl.ok(&["allow", "node-c"]), "node node-c may claim labels any; kinds any\n");
    let e = ctl.fails(Some(&ctl.token), &["allow", "node-x"]);
    assert!(e.contains("not_found"), "{e}");

    let e = ctl.fails(Some(&ctl.token), &["join-key", "--allow-label", "Zone=*"]);
    assert!(e.contains("allowedLabels[0]") && e.contains("invalid_request"), "{e}");
}

/// docs/reference.md#fleetctl, rollouts: `rollout status --watch`, run the moment after a
/// change in the CP, waits for the controller to read it and follows the new rollout to its
/// end (exit 0) — never answering with the previous rollout's `complete` — or to its halt
/// (exit 1, saying what to do); `--revision N` waits for that revision; `rollouts` lists the
/// halted one; `undo`, `pause` and `resume` answer with the view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_status_watch_follows_a_rollout_and_fails_on_a_halt() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, ctl, _nodes) = reviewer_rolled_out(dir.path()).await;
    let set = |image: &str| set_reviewer_image(&fleet, image);
    let revision = || -> u64 {
        let v: Value = serde_json::from_str(&ctl.ok(&["rollout", "status", "reviewer", "-o", "json"])).unwrap();
        v["target"]["revision"].as_u64().unwrap()
    };

    let before = revision();
    assert!(set("fleet-agent:2"));
    let watch = ctl.run(&["rollout", "status", "reviewer", "--watch", "--timeout", "60"]);
    let (out, err) = (text(&watch.stdout), text(&watch.stderr));
    assert!(watch.status.success(), "{out}{err}");
    assert!(
        err.starts_with("reviewer: waiting for the controller to read the CP… (it shows complete for revision"),
        "the previous rollout's complete is no answer: {err}"
    );
    assert!(out.starts_with("reviewer: complete 2/2 updated, 2/2 ready") && out.contains("fleet-agent:2"), "{out}");
    assert!(out.contains("previous: ") && out.contains("(fleet-agent:1)"), "{out}");
    assert!(err.lines().any(|l| l.starts_with("reviewer: ") && l.contains("target ")), "a progress line: {err}");
    let j: Value = serde_json::from_str(&ctl.ok(&["rollout", "status", "reviewer", "-o", "json"])).unwrap();
    assert_eq!(j["target"]["revision"].as_u64(), Some(before + 1), "{j}");
    assert!(j["cpReadAt"].is_string() && j["asOf"].is_string(), "{j}");
    assert_eq!(ctl.ok(&["rollouts"]), "no rollout in progress\n");

    // --revision: the answer is the rollout of that revision or a later one.
    assert!(set("fleet-agent:3"));
    let n = (before + 2).to_string();
    let watch =
        ctl.run(&["rollout", "status", "reviewer", "--watch", "--revision", &n, "--timeout", "60", "-o", "json"]);
    let (out, err) = (text(&watch.stdout), text(&watch.stderr));
    assert!(watch.status.success(), "{out}{err}");
    assert!(err.starts_with(&format!("reviewer: waiting for revision {n} (")), "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((j["state"].as_str(), j["target"]["image"].as_str()), (Some("complete"), Some("fleet-agent:3")), "{j}");
    assert_eq!(j["target"]["revision"].as_u64(), Some(before + 2), "{j}");
    let alone = ctl.run(&["rollout", "status", "reviewer", "--revision", "1"]);
    assert!(!alone.status.success() && text(&alone.stderr).contains("--watch"), "{}", text(&alone.stderr));

    assert!(set("fleet-agent:bad"));
    let watch = ctl.run(&["rollout", "status", "reviewer", "--watch", "--timeout", "60"]);
    let (out, err) = (text(&watch.stdout), text(&watch.stderr));
    assert_eq!(watch.status.code(), Some(1), "{out}{err}");
    assert!(out.starts_with("reviewer: halted 1/2 updated"), "{out}");
    assert!(out.contains("failed: crashloop (exited with code 1)"), "{out}");
    assert!(
        err.contains("the rollout of reviewer is halted") && err.contains("fleetctl rollout undo reviewer"),
        "{err}"
    );
    let list = ctl.ok(&["rollouts"]);
    assert!(
        list.starts_with("AGENT")
            && list.lines().nth(1).is_some_and(|l| l.starts_with("reviewer") && l.contains("halted")),
        "{list}"
    );
    let j: Value = serde_json::from_str(&ctl.ok(&["rollouts", "-o", "json"])).unwrap();
    assert_eq!(j["items"][0]["state"], "halted");

    let undo = ctl.ok(&["rollout", "undo", "reviewer"]);
    assert!(undo.starts_with("rollout of reviewer: undo applied\nreviewer: "), "{undo}");
    let watch = ctl.run(&["rollout", "status", "reviewer", "--watch", "--timeout", "60"]);
    assert!(watch.status.success(), "{}{}", text(&watch.stdout), text(&watch.stderr));
    assert!(text(&watch.stdout).contains("fleet-agent:3"), "{}", text(&watch.stdout));
    let paused = ctl.ok(&["rollout", "pause", "reviewer"]);
    assert!(paused.contains("pause applied"), "{paused}");
    assert!(ctl.ok(&["rollout", "resume", "reviewer"]).contains("resume applied"));
    let e = ctl.fails(Some(&ctl.token), &["rollout", "undo", "coder"]);
    assert!(e.contains("no previous template") && e.contains("no_previous_template"), "{e}");
}

/// A node's maintenance windows, as it announced them, in its view and in `fleetctl node`
/// (docs/behaviour.md#maintenance-windows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_s_maintenance_windows_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, ctl) = dev_fleet(dir.path()).await;
    let window = serde_json::json!({"schedule": "*/5 * * * *", "durationMinutes": 2, "timeZone": "Europe/Paris"});
    let announce = serde_json::json!({"labels": [], "executorKinds": ["claude-code"], "capacity": {"slots": 1},
                                      "secrets": [], "executorImages": {}, "maintenanceWindows": [window]});
    join_announcing(&reqwest::Client::new(), &ctl.url, &fleet.join_key, "node-w", announce).await;
    let text = ctl.ok(&["node", "node-w"]);
    assert!(text.contains("Window:     */5 * * * * for 2 min, Europe/Paris"), "{text}");
    let view: Value = serde_json::from_str(&ctl.ok(&["node", "node-w", "-o", "json"])).unwrap();
    assert_eq!(view["maintenanceWindows"], serde_json::json!([window]), "{view}");
    let key = ctl.ok(&["join-key", "--ttl", "600"]);
    let _b = join_node(&ctl.url, key.trim(), "node-b", 1).await;
    let other = ctl.ok(&["node", "node-b"]);
    assert!(!other.contains("Window:"), "a node without windows shows none: {other}");
    fleet.controller.shutdown().await;
}
