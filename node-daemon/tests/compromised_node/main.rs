//! The Docker guard against a compromised node (docs/behaviour.md#the-guards-own-files): an
//! attacker with the node's uid, every file the node can write and the guard's socket, calling
//! in any order, against this machine's real engine. Each attack is judged by its outcome —
//! what the engine made (`docker inspect`) and what a container can read from inside — never
//! by the guard's status codes alone.
//!
//! `FLEET_GUARD_SEQ_STEPS` (default 120) random steps make the sequence fuzzer's run;
//! `FLEET_GUARD_SEQ_SEED` repeats one.

mod lab;
mod sequences;

use lab::{foreign_container, inside, inspect, Lab, PAT};
use serde_json::{json, Value};

fn skip() -> bool {
    if !fleet_e2e::docker_available() {
        return true;
    }
    fleet_e2e::ensure_test_images();
    false
}

/// The container's lease directory (docs/behaviour.md#busy-replicas): the one writable
/// bind, a real directory of the guard's, at `/run/fleet/busy`.
pub fn is_lease_dir(m: &Value) -> bool {
    let source = std::path::Path::new(m["Source"].as_str().unwrap_or(""));
    m["Destination"] == "/run/fleet/busy"
        && source.file_name().is_some_and(|n| n == "busy")
        && std::fs::symlink_metadata(source).is_ok_and(|f| f.is_dir())
}

/// Every bind of a container is one of the guard's own files (in a directory of `guardDir`),
/// holding the PAT or a secret its kind may mount, and nothing else.
fn assert_binds_are_the_guards(lab: &Lab, c: &Value) {
    for m in c["Mounts"].as_array().into_iter().flatten().filter(|m| m["Type"] == "bind") {
        let source = std::path::Path::new(m["Source"].as_str().unwrap());
        assert_eq!(source.parent().and_then(|d| d.parent()), Some(lab.guard_dir().as_path()), "{m}");
        if is_lease_dir(m) {
            continue;
        }
        let content = std::fs::read_to_string(source).unwrap();
        assert!(content == PAT || content == "gh-token", "a bind carries {content:?}: {m}");
        assert_eq!(m["RW"], false, "{m}");
    }
}

/// Show 1: the node swaps its PAT directory for a link to `/` after the create, before the
/// start, and between two starts; no start ever binds anything but the guard's copies.
#[test]
fn a_link_swapped_in_between_any_two_calls_never_reaches_the_engine() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnswap");
    let name = format!("{}-coder-0", lab.prefix);
    lab.own_volume("coder");
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&lab.own_body("coder")));
    assert_eq!(s, 201, "the node's own body: {v}");
    let state = lab.state();
    // Between the create and the start: the PAT directory becomes a link to the host's root.
    assert!(lab.as_node(&format!("mv {state}/agents/coder {state}/agents/kept && ln -s / {state}/agents/coder")));
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/{name}/start"), None);
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("coder is a symbolic link"), "{v}");
    assert_eq!(inspect(&name).unwrap()["State"]["Running"], false, "never started with the link");

    // The directory back: the start binds the guard's copies, and the container sees its PAT only.
    assert!(lab.as_node(&format!("rm {state}/agents/coder && mv {state}/agents/kept {state}/agents/coder")));
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/{name}/start"), None);
    assert_eq!(s, 204, "{v}");
    let c = inspect(&name).unwrap();
    assert_binds_are_the_guards(&lab, &c);
    assert_eq!(inside(&name, &["cat", "/run/secrets/agent-pat"]), (true, PAT.to_string()));
    let (_, listed) = inside(&name, &["ls", "/run/secrets"]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), vec!["agent-pat", "gh"]);
    for host_file in ["/etc/shadow", "/run/docker.sock", "/var/run/docker.sock"] {
        assert!(!inside(&name, &["test", "-e", host_file]).0, "{host_file} is visible inside");
    }

    // Between two starts: stopped, the link swapped in again (the file itself a link, this time).
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/{name}/stop?t=1"), None).0, 204);
    assert!(
        lab.as_node(&format!("rm {state}/agents/coder/agent-pat && ln -s /etc/shadow {state}/agents/coder/agent-pat"))
    );
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/{name}/start"), None);
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("agent-pat is a symbolic link"), "{v}");
    assert_binds_are_the_guards(&lab, &inspect(&name).unwrap());
}

/// Show 1, at create: a link already in place is refused before anything is made.
#[test]
fn a_link_in_place_at_create_makes_nothing() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnlink");
    lab.own_volume("coder");
    let state = lab.state();
    assert!(lab.as_node(&format!("rm -r {state}/agents/coder && ln -s /etc {state}/agents/coder")));
    let name = format!("{}-coder-0", lab.prefix);
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&lab.own_body("coder")));
    assert_eq!(s, 403, "{v}");
    assert!(inspect(&name).is_none(), "the engine made nothing");
    let leftovers = std::fs::read_dir(lab.guard_dir()).unwrap().count();
    assert_eq!(leftovers, 0, "a refused create leaves no files of the guard's");
}

/// Show 2: a name given twice, a foreign container reached by name, id or id prefix, and a
/// decoy of the node's own removed between calls: nothing foreign is read or stopped.
#[test]
fn names_are_read_once_and_foreign_containers_do_not_exist_for_the_node() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnname");
    lab.own_volume("coder");
    let body = lab.own_body("coder");
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name=evil&name={}-x", lab.prefix), Some(&body));
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("given twice"), "{v}");
    assert!(inspect("evil").is_none() && inspect(&format!("{}-x", lab.prefix)).is_none());

    let victim_name = format!("{}v-victim", lab.prefix);
    let victim = foreign_container(&victim_name);
    let id = victim["Id"].as_str().unwrap().to_string();
    let started = victim["State"]["StartedAt"].clone();
    for reference in [victim_name.as_str(), &id, &id[..12], &id[..4]] {
        for (method, path) in [
            ("GET", format!("/v1.41/containers/{reference}/json")),
            ("POST", format!("/v1.41/containers/{reference}/stop?t=0")),
            ("DELETE", format!("/v1.41/containers/{reference}?force=true")),
        ] {
            let (s, v) = lab.call(method, &path, None);
            assert_eq!(s, 404, "{method} {path}: {v}");
            assert!(!v.to_string().contains("do-not-read"), "{v}");
        }
    }
    // A decoy of the node's own, looked up and then removed: the next call by its name
    // answers for nothing; it never falls through to another object.
    let decoy = format!("{}-coder-0", lab.prefix);
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/create?name={decoy}"), Some(&body)).0, 201);
    assert_eq!(lab.call("DELETE", &format!("/v1.41/containers/{decoy}?force=true"), None).0, 204);
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/{decoy}/stop"), None).0, 404);
    let after = inspect(&victim_name).unwrap();
    assert_eq!((after["State"]["Running"].clone(), after["State"]["StartedAt"].clone()), (json!(true), started));
    let _ = std::process::Command::new("docker").args(["rm", "-f", &victim_name]).output();
}

/// Show 3: another node's volume on the same engine cannot be mounted or taken over; a kind
/// without `user` runs as the node's uid, and root is refused.
#[test]
fn another_node_s_volume_and_root_are_out_of_reach() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnvol");
    lab.own_volume("coder");
    let theirs = format!("{}-coder-0-theirs", lab.prefix);
    let made = std::process::Command::new("docker")
        .args(["volume", "create", "--label", "fleet.managed=1", "--label", "fleet.node=someone-else", &theirs])
        .output()
        .unwrap();
    assert!(made.status.success());
    let mut body = lab.own_body("coder");
    for m in body["HostConfig"]["Mounts"].as_array_mut().unwrap().iter_mut().filter(|m| m["Type"] == "volume") {
        m["Source"] = json!(theirs);
    }
    let name = format!("{}-coder-0", lab.prefix);
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&body));
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("is not this node's"), "{v}");
    let claim = json!({"Name": theirs, "Labels": {"fleet.managed": "1", "fleet.node": lab.node}});
    let (s, v) = lab.call("POST", "/v1.41/volumes/create", Some(&claim));
    assert_eq!(s, 403, "taking it over by creating it again: {v}");
    let users = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("volume={theirs}")])
        .output()
        .unwrap();
    assert!(users.stdout.is_empty(), "no container mounts it");
    let _ = std::process::Command::new("docker").args(["volume", "rm", &theirs]).output();

    for user in [json!("0:0"), json!("0"), Value::Null] {
        let mut b = lab.own_body("coder");
        b["User"] = user.clone();
        let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&b));
        assert_eq!(s, 403, "User {user}: {v}");
    }
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&lab.own_body("coder"))).0, 201);
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/{name}/start"), None).0, 204);
    assert_eq!(inspect(&name).unwrap()["Config"]["User"], "10001:10001");
    assert_eq!(inside(&name, &["id", "-u"]).1.trim(), "10001");
}

/// A node whose prefix another node's container or volume on the engine starts with would
/// read that object as its own: the guard refuses to start, naming the object and the fix, and
/// leaves the object alone.
#[test]
fn a_guard_does_not_start_where_another_node_s_objects_carry_its_prefix() {
    if skip() {
        return;
    }
    for (prefix, what) in [("fcnpfxc", "container"), ("fcnpfxv", "volume")] {
        fleet_e2e::cleanup(prefix);
        let theirs = format!("{prefix}-coder-0");
        if what == "container" {
            foreign_container(&theirs);
        } else {
            let made = std::process::Command::new("docker")
                .args(["volume", "create", "--label", "fleet.managed=1", "--label", "fleet.node=someone-else", &theirs])
                .output()
                .unwrap();
            assert!(made.status.success());
        }
        let (exit, log) = Lab::refused(prefix);
        let exit = exit.unwrap_or_else(|| panic!("the guard served beside another node's {what}:\n{log}"));
        assert!(!exit.success(), "{what}: {exit}\n{log}");
        assert!(
            log.contains(&format!("\"{theirs}\" on this engine is named with this node's prefix")),
            "{what}:\n{log}"
        );
        assert!(log.contains("containerPrefix"), "the fix is named:\n{log}");
        assert!(inspect(&theirs).is_some(), "another node's {what} is left alone");
        fleet_e2e::cleanup(prefix);
    }
}

/// Show 4: a kind cannot obtain another kind's secret: not by naming it, not by copying or
/// linking it into the node's own tree (the node cannot read it), not into its environment
/// (the node never learns its value).
#[test]
fn a_kind_never_obtains_another_kind_s_secret() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnsec");
    lab.own_volume("coder");
    let secrets = lab.secrets().display().to_string();
    let state = lab.state();
    let name = format!("{}-coder-0", lab.prefix);
    let mut body = lab.own_body("coder");
    body["HostConfig"]["Mounts"][1]["Source"] = json!(format!("{secrets}/other-secret"));
    let (s, v) = lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&body));
    assert_eq!(s, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("executors.k.secrets does not list it"), "{v}");
    assert!(!lab.as_node(&format!("cat {secrets}/other-secret")), "the node reads no secret's value");
    assert!(!lab.as_node(&format!("cp {secrets}/other-secret {state}/agents/coder/agent-pat")), "nor copies one");
    assert!(
        !lab.as_node(&format!("ln -f {secrets}/other-secret {state}/agents/coder/agent-pat")),
        "nor links one into its tree"
    );
    assert!(!lab.as_node(&format!("touch {secrets}/planted")), "nor writes the secrets directory");
    // What the node can do with its own tree: write its own PAT file, which is the node's own
    // knowledge; the container it makes gets exactly that.
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&lab.own_body("coder"))).0, 201);
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/{name}/start"), None).0, 204);
    assert_eq!(inside(&name, &["cat", "/run/secrets/gh"]), (true, "gh-token".to_string()));
    assert!(!inside(&name, &["test", "-e", "/run/secrets/other-secret"]).0);
}

/// The rest of the review's list: images of other workloads, queries on start, stop and
/// delete, a path in another form.
#[test]
fn images_queries_and_paths_reach_only_what_the_node_uses() {
    if skip() {
        return;
    }
    let lab = Lab::new("fcnmisc");
    let own = fleet_e2e::image("sleep");
    assert_eq!(lab.call("GET", &format!("/v1.41/images/{own}/json"), None).0, 200);
    let (s, v) = lab.call("GET", &format!("/v1.41/images/{}/json", fleet_e2e::image("exit1")), None);
    assert_eq!(
        (s, v["message"].as_str()),
        (404, Some(format!("No such image: {}", fleet_e2e::image("exit1")).as_str()))
    );
    lab.own_volume("coder");
    let name = format!("{}-coder-0", lab.prefix);
    assert_eq!(lab.call("POST", &format!("/v1.41/containers/create?name={name}"), Some(&lab.own_body("coder"))).0, 201);
    for path in [
        format!("/v1.41/containers/{name}/start?checkpoint=c1&checkpoint-dir=/tmp"),
        format!("/v1.41/containers/{name}/stop?signal=SIGKILL"),
        format!("/v1.41/containers/{name}?link=true"),
    ] {
        let method = if path.ends_with("link=true") { "DELETE" } else { "POST" };
        let (s, v) = lab.call(method, &path, None);
        assert_eq!(s, 403, "{path}: {v}");
    }
    assert_eq!(inspect(&name).unwrap()["State"]["Running"], false, "none of them started it");
    let (s, v) = lab.call("POST", "//containers/create?name=x", Some(&lab.own_body("coder")));
    assert_eq!(s, 403, "{v}");
}

/// Show 1-4 as a class: random sequences of the node's calls and file changes, in any order.
#[test]
fn random_sequences_of_calls_and_swaps_keep_every_invariant() {
    if skip() {
        return;
    }
    sequences::run(&Lab::new("fcnseq"));
}
