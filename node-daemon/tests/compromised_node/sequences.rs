//! The guard's fuzzer over sequences of calls (docs/behaviour.md#the-guards-own-files): the node
//! creates, starts, stops and removes its containers and another node's, by name, id and id
//! prefix, with bodies of its own and bodies bent toward another kind's secret, root, a foreign
//! volume or a host path — and between any two calls swaps its own files for links, or puts
//! them back. After every step the engine's account must hold: every container of the node
//! binds only the guard's copies and runs as the node's user, and the other node's container
//! runs on untouched.

use super::lab::{foreign_container, inside, inspect, Lab};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::process::Command;

const AGENTS: [&str; 2] = ["coder", "b"];

pub fn run(lab: &Lab) {
    let steps: usize = std::env::var("FLEET_GUARD_SEQ_STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    let seed: u64 =
        std::env::var("FLEET_GUARD_SEQ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("guard sequences: {steps} steps, FLEET_GUARD_SEQ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let state = lab.state();
    assert!(lab.as_node(&format!("mkdir -p {state}/agents/b && printf pat-of-b > {state}/agents/b/agent-pat")));
    AGENTS.iter().for_each(|a| lab.own_volume(a));
    let victim = format!("{}v-victim", lab.prefix);
    let before = foreign_container(&victim);
    let mut admitted = 0;
    for step in 0..steps {
        let what = one_step(lab, &mut rng, &victim, before["Id"].as_str().unwrap());
        admitted += usize::from(what.1);
        check(lab, &victim, &before, &format!("seed {seed} step {step} ({})", what.0));
    }
    let _ = Command::new("docker").args(["rm", "-f", &victim]).output();
    eprintln!("guard sequences: {steps} steps, {admitted} calls admitted, every invariant held");
    assert!(admitted > steps / 10, "the sequences reach the engine, so the invariants are exercised");
}

/// One random step; what it was and whether the guard admitted a call.
fn one_step(lab: &Lab, rng: &mut StdRng, victim: &str, victim_id: &str) -> (String, bool) {
    let agent = AGENTS[rng.gen_range(0..AGENTS.len())];
    let own = format!("{}-{agent}-0", lab.prefix);
    let target = match rng.gen_range(0..6) {
        0 => victim.to_string(),
        1 => victim_id[..rng.gen_range(1..=victim_id.len())].to_string(),
        _ => own.clone(),
    };
    match rng.gen_range(0..9) {
        0 | 1 => create(lab, rng, agent, &own),
        2 | 3 => call(lab, "POST", &format!("/v1.41/containers/{target}/start")),
        4 => call(lab, "POST", &format!("/v1.41/containers/{target}/stop?t=0")),
        5 => call(lab, "DELETE", &format!("/v1.41/containers/{target}?force=true")),
        6 => call(lab, "GET", &format!("/v1.41/containers/{target}/json")),
        _ => (swap(lab, rng, agent), false),
    }
}

fn call(lab: &Lab, method: &str, path: &str) -> (String, bool) {
    let (s, _) = lab.call(method, path, None);
    (format!("{method} {path} -> {s}"), reached(s))
}

/// A create of the node's own body, or of one bent toward something it may not have.
fn create(lab: &Lab, rng: &mut StdRng, agent: &str, name: &str) -> (String, bool) {
    let mut body = lab.own_body(agent);
    let secrets = lab.secrets().display().to_string();
    let bent = match rng.gen_range(0..8) {
        0 => Some(("another kind's secret", json!(format!("{secrets}/other-secret")), 1)),
        1 => Some(("the PAT directory", json!(format!("{}/agents/{agent}", lab.state())), 0)),
        2 => Some(("another agent's PAT", json!(format!("{}/agents/{}/agent-pat", lab.state(), other(agent))), 0)),
        3 => Some(("the host's root", json!("/"), 0)),
        4 => {
            body["User"] = json!("0:0");
            None
        }
        _ => None,
    };
    if let Some((_, source, i)) = &bent {
        body["HostConfig"]["Mounts"][*i]["Source"] = source.clone();
    }
    let (s, _) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&body));
    (format!("create {name} {} -> {s}", bent.map_or("as the node", |b| b.0)), reached(s))
}

/// Whether the engine answered the call (a success, or its own "already started", "already
/// stopped" or name conflict): the guard let it through.
fn reached(status: u16) -> bool {
    (200..300).contains(&status) || status == 304 || status == 409
}

fn other(agent: &str) -> &str {
    if agent == "coder" {
        "b"
    } else {
        "coder"
    }
}

/// The node's own files swapped for links (the directory or the file), or put back.
fn swap(lab: &Lab, rng: &mut StdRng, agent: &str) -> String {
    let dir = format!("{}/agents/{agent}", lab.state());
    let to = ["/", "/etc", "/var/run", "/etc/shadow"][rng.gen_range(0..4)];
    let script = match rng.gen_range(0..4) {
        0 => format!("[ -L {dir} ] || mv {dir} {dir}.kept; rm -f {dir}; ln -s {to} {dir}"),
        1 => format!("[ -L {dir} ] || {{ rm -f {dir}/agent-pat; ln -s {to} {dir}/agent-pat; }}"),
        _ => format!(
            "if [ -L {dir} ]; then rm {dir} && mv {dir}.kept {dir}; fi; rm -f {dir}/agent-pat; printf pat-of-{agent} > {dir}/agent-pat"
        ),
    };
    lab.as_node(&script);
    format!("files: {script}")
}

/// The invariants, from the engine's account.
fn check(lab: &Lab, victim: &str, before: &Value, what: &str) {
    let ids = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=fleet.node={}", lab.node)])
        .output()
        .unwrap();
    for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
        let Some(c) = inspect(id) else { continue };
        assert_eq!(c["Config"]["User"], "10001:10001", "{what}: {}", c["Config"]);
        assert_eq!(c["HostConfig"]["Privileged"], false, "{what}");
        for m in c["Mounts"].as_array().into_iter().flatten().filter(|m| m["Type"] == "bind") {
            let source = std::path::Path::new(m["Source"].as_str().unwrap());
            let ours = source.parent().and_then(|d| d.parent()) == Some(lab.guard_dir().as_path());
            if ours && super::is_lease_dir(m) {
                continue;
            }
            let content = std::fs::read_to_string(source).unwrap_or_default();
            let allowed = ["pat-of-coder", "pat-of-b", "gh-token"].contains(&content.as_str());
            assert!(ours && allowed && m["RW"] == false, "{what}: a bind of {m} holding {content:?}");
        }
        if c["State"]["Running"] == true {
            assert!(!inside(id, &["test", "-e", "/run/docker.sock"]).0, "{what}: the engine's socket inside");
        }
    }
    let v = inspect(victim).unwrap_or_else(|| panic!("{what}: the other node's container is gone"));
    assert_eq!(v["State"]["Running"], true, "{what}: the other node's container was stopped");
    assert_eq!(v["State"]["StartedAt"], before["State"]["StartedAt"], "{what}: it was restarted");
}
