//! End-to-end, the normal life of a fleet (issue scenarios 1–8): join, placement, the PAT
//! inside the container, revisions, image and replica changes, crash loops, exit 75,
//! a disallowed image, and a secret that arrives later.

mod support;

use fleet_e2e::{docker_available, ensure_test_images, image};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_run_revise_reimage_and_scale() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2ea").await;
    let mut n1 = f.node("n1", "labels: [repos, zone=a]\n").await;
    std::fs::write(n1.root.join("secrets/github-token"), "gh").unwrap();
    std::fs::write(n1.root.join("secrets/README"), "not a secret name").unwrap();
    f.devkit.put_agent(agent("coder", 1));
    n1.start();

    // 1. Joined and online with what it announced.
    let view =
        eventually(30, "n1 online", || async { f.node_view(&n1.name).await.filter(|n| n["status"] == "online") }).await;
    assert!(n1.log().contains(&format!("joined the fleet as {}", view["id"].as_str().unwrap())), "{}", n1.log());
    assert_eq!(view["labels"], json!(["repos", "zone=a"]));
    assert_eq!(view["executorKinds"], json!(["k"]));
    assert_eq!(view["executorImages"], json!({"k": ["fleet-test-agent:*"]}));
    assert_eq!(view["capacity"], json!({"slots": 4}));
    assert_eq!(view["secrets"], json!(["github-token"]));

    // 2. Placed, running, the PAT inside is the one IAM issued; the CP sees running.
    let name = n1.container("coder", 0);
    let pat = eventually(60, "the agent read its PAT", || async { pat_seen_by(&name) }).await;
    assert_eq!(live_pat(&f, "coder"), vec![pat.clone()]);
    // The container may print its PAT before the node has written its own line about it.
    eventually(10, "the node logs `started <container-name>`", || async {
        n1.log().contains(&format!("started {name}")).then_some(())
    })
    .await;
    let s = f.status_where("coder", 30, "coder running", |s| s["phase"] == "running").await;
    assert_eq!(s["observedRevision"], 1);
    let id = container(&name).unwrap()["Id"].as_str().unwrap().to_string();

    // 3. A new revision only: the container is not recreated.
    f.devkit.edit_agent("coder", |a| a["revision"] = json!(2));
    f.status_where("coder", 30, "observed revision 2", |s| s["observedRevision"] == 2).await;
    let now = container(&name).unwrap_or_else(|| panic!("container gone; node log:\n{}", n1.log()));
    assert_eq!(now["Id"], id.as_str(), "same container");

    // 4. Image change: drained, then recreated; replicas up and down.
    f.devkit.edit_agent("coder", |a| a["executor"]["image"] = json!(image("sleep2")));
    eventually(60, "recreated on sleep2", || async {
        container(&name).filter(|c| c["Config"]["Image"] == image("sleep2").as_str() && c["State"]["Running"] == true)
    })
    .await;
    assert_ne!(container(&name).unwrap()["Id"], id.as_str());
    f.devkit.edit_agent("coder", |a| a["placement"]["replicas"] = json!(2));
    let second = n1.container("coder", 1);
    eventually(60, "a second replica", || async { container(&second).filter(|c| c["State"]["Running"] == true) }).await;
    f.status_where("coder", 30, "two ready", |s| s["readyReplicas"] == 2).await;
    f.devkit.edit_agent("coder", |a| a["placement"]["replicas"] = json!(1));
    eventually(60, "replica 1 removed", || async { container(&second).is_none().then_some(()) }).await;
    assert!(container(&name).is_some(), "replica 0 stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loops_exit_75_disallowed_images_and_late_secrets() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2eb").await;
    let mut n1 = f.node("n1", "").await;
    let with_image = |key: &str, tag: &str| {
        let mut a = agent(key, 1);
        a["executor"]["image"] = json!(image(tag));
        a
    };
    let mut needs = agent("needs", 1);
    needs["placement"]["secrets"] = json!(["late-token"]);
    f.devkit.put_agents(vec![with_image("crashy", "exit1"), with_image("quick", "exit75"), needs]);
    n1.start();

    // 5. A crashing image: crashloop, and the CP says crash_looping with the replica's message.
    let s = f.status_where("crashy", 90, "crash_looping", |s| s["phase"] == "crash_looping").await;
    assert_eq!(s["reason"]["message"], "exited with code 1");
    assert_eq!(s["replicas"][0]["lastExitCode"], 1);

    // 6. Exit 75: restarted at once, never a crash loop.
    let s = f.status_where("quick", 60, "quick restarted", |s| s["replicas"][0]["restarts"].as_u64() >= Some(1)).await;
    assert_eq!(s["replicas"][0]["lastExitCode"], 75);
    assert_ne!(s["phase"], "crash_looping");

    // 8. A secret added to secretsDir places the waiting agent and its container starts.
    f.status_where("needs", 30, "needs waits for the secret", |s| s["reason"]["code"] == "no_secret").await;
    std::fs::write(n1.root.join("secrets/late-token"), "t").unwrap();
    let name = n1.container("needs", 0);
    eventually(90, "needs started after its secret arrived", || async {
        container(&name).filter(|c| c["State"]["Running"] == true)
    })
    .await;

    // 7. The node's operator narrows the allow-list: the node stops the container at once, with
    // no restart, and the agent then waits for a node that admits its image.
    f.devkit.put_agent(with_image("picky", "sleep2"));
    let picky = n1.container("picky", 0);
    eventually(60, "picky running", || async { container(&picky).filter(|c| c["State"]["Running"] == true) }).await;
    n1.kill9();
    let yaml = std::fs::read_to_string(n1.config())
        .unwrap()
        .replace("images: [\"fleet-test-agent:*\"]", "images: [\"fleet-test-agent:exit*\"]");
    std::fs::write(n1.config(), yaml).unwrap();
    n1.start();
    eventually(60, "picky's container stopped and removed", || async { container(&picky).is_none().then_some(()) })
        .await;
    let s = f
        .status_where("picky", 60, "picky waits: image_not_allowed", |s| s["reason"]["code"] == "image_not_allowed")
        .await;
    assert_eq!(s["phase"], "waiting_for_node");
    assert!(container(&picky).is_none(), "never restarted");
}
