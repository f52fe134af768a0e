//! End-to-end in the deployed shapes (issue scenarios 16 and 17): the node as a container
//! with the Docker socket and host paths mounted, and a node that reaches the controller
//! through a TLS-terminating nginx that strips a `/fleet` prefix, trusting a self-signed CA
//! given by `caFile`.

mod support;

use fleet_e2e::{docker_available, ensure_fleet_images, ensure_test_images};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use support::*;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_in_a_container_with_host_paths() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    ensure_fleet_images();
    let f = Fleet::start("e2eh").await;
    // Host paths mounted at the same paths, owned by the node's uid 10001.
    let host = f.dir.path().join("hostnode");
    std::fs::create_dir_all(host.join("secrets")).unwrap();
    std::fs::write(host.join("secrets/github-token"), "gh-from-host").unwrap();
    std::fs::write(host.join("join-key"), f.join_key().await).unwrap();
    let name = "e2eh-boxed";
    let yaml = format!(
        "controllerUrl: {url}\nname: {name}\ncapacity: {{slots: 2}}\nexecutors:\n  k: {{image: \"{img}\"}}\n\
         stateDir: {h}/state\nsecretsDir: {h}/secrets\njoinKeyFile: {h}/join-key\nobserveSeconds: 5\ncontainerPrefix: {name}\n",
        url = f.url,
        img = fleet_e2e::image("sleep"),
        h = host.display()
    );
    std::fs::write(host.join("node.yaml"), yaml).unwrap();
    run(Command::new("chown").args(["-R", "10001:10001"]).arg(&host));
    std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock_gid = run(Command::new("stat").args(["-c", "%g", "/var/run/docker.sock"])).trim().to_string();
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let hp = host.display().to_string();
    run(Command::new("docker").args([
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "--group-add",
        &sock_gid,
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        "-v",
        &format!("{hp}:{hp}"),
        "fleet-node:e2e",
        "--config",
        &format!("{hp}/node.yaml"),
    ]));
    let mut a = agent("boxed", 1);
    a["placement"]["secrets"] = json!(["github-token"]);
    f.devkit.put_agent(a);
    let agent_container = format!("{name}-boxed-0");
    let pat = eventually(90, "the agent started by the containerised node reads its PAT", || async {
        pat_seen_by(&agent_container)
    })
    .await;
    let node_logs =
        String::from_utf8_lossy(&Command::new("docker").args(["logs", name]).output().unwrap().stderr).to_string();
    assert_eq!(live_pat(&f, "boxed"), vec![pat], "node logs:\n{node_logs}");
    assert!(logs(&agent_container).contains("secret github-token=gh-from-host"), "{}", logs(&agent_container));
    let node_user = run(Command::new("docker").args(["inspect", "-f", "{{.Config.User}}", name]));
    assert_eq!(node_user.trim(), "10001:10001");
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_tls_proxy_that_strips_the_prefix() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    if Command::new("nginx").arg("-v").output().is_err() {
        assert!(
            std::env::var("FLEET_E2E").as_deref() != Ok("1"),
            "FLEET_E2E=1 but nginx is missing (apt-get install nginx-light)"
        );
        return;
    }
    let f = Fleet::start("e2ei").await;
    let d = f.dir.path().join("tls-own");
    let proxy = TlsProxy::start(&d, f.url.trim_start_matches("http://"));
    let p = |n: &str| d.join(n).display().to_string();
    let public = proxy.url.clone();
    let mut n = f.node("tls", &format!("caFile: {}\n", p("ca.pem"))).await;
    let yaml = std::fs::read_to_string(n.config())
        .unwrap()
        .replace(&format!("controllerUrl: {}", f.url), &format!("controllerUrl: {public}"));
    std::fs::write(n.config(), yaml).unwrap();
    n.start();

    // Join, placement, the PAT inside, statuses and a long-poll wake-up, all through the proxy.
    eventually(30, "joined through the proxy", || async {
        f.node_view(&n.name).await.filter(|v| v["status"] == "online")
    })
    .await;
    f.devkit.put_agent(agent("secure", 1));
    let name = n.container("secure", 0);
    let pat = eventually(60, "the agent reads its PAT", || async { pat_seen_by(&name) }).await;
    assert_eq!(live_pat(&f, "secure"), vec![pat]);
    f.status_where("secure", 30, "running", |s| s["phase"] == "running").await;
    f.devkit.edit_agent("secure", |a| a["revision"] = json!(2));
    f.status_where("secure", 30, "revision 2 observed", |s| s["observedRevision"] == 2).await;
    assert!(n.log().contains("joined the fleet as"), "{}", n.log());
    // The admin API answers under the prefix too.
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(d.join("ca.pem")).unwrap()).unwrap())
        .build()
        .unwrap();
    let r = https.get(format!("{public}/api/v1/placements")).bearer_auth(&f.admin_token).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // And a node without the CA refuses the proxy's certificate.
    let r = reqwest::Client::new().get(format!("{public}/healthz")).send().await;
    assert!(r.is_err(), "an untrusted certificate is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_node_starts_containers_in_one_command() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let node = "e2edev";
    fleet_e2e::cleanup(node);
    let (api, met, dk) = (free_port(), free_port(), free_port());
    let mut dev = std::process::Command::new(bin("fleet-controller"))
        .args(["dev", "--with-node", "--node-name", node, "--dir"])
        .arg(dir.path())
        .args(["--listen", &format!("127.0.0.1:{api}"), "--metrics-listen", &format!("127.0.0.1:{met}")])
        .args(["--devkit-listen", &format!("127.0.0.1:{dk}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let status = eventually(90, "coder running in the dev fleet's CP", || async {
        let v: serde_json::Value =
            http.get(format!("http://127.0.0.1:{dk}/devkit/statuses/coder")).send().await.ok()?.json().await.ok()?;
        (v["phase"] == "running").then_some(v)
    })
    .await;
    assert_eq!(status["node"], node);
    let log = logs(&format!("{node}-coder-0"));
    assert!(log.contains("agent coder replica 0") && log.contains("bytes in /run/secrets/agent-pat"), "{log}");
    // SIGTERM: dev stops the node it started (a SIGKILL would orphan it).
    let _ = Command::new("kill").args(["-TERM", &dev.id().to_string()]).status();
    let st = dev.wait().unwrap();
    assert!(st.success(), "dev exits cleanly on SIGTERM");
    fleet_e2e::cleanup(node);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(container(&format!("{node}-coder-0")).is_none(), "no orphaned node recreated the containers");
}
