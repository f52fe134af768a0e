//! Observability (docs/behaviour.md#logs-and-metrics): JSON logs when asked, one event per state change with the node
//! and agent as fields, and the metric families on their own port.

mod support;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_metric_families() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let mut env = env_for(&dk, dir.path(), free_port(), metrics_port);
    env.insert("FLEET_LOG_FORMAT".into(), "json".into());
    let log = dir.path().join("c.log");
    let ctl = ControllerProcess::spawn(env, log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 600));
    let mut n = TestNode::new(&ctl.url, "obs-1", json!({"executorKinds": ["k"], "capacity": {"slots": 2}}));
    n.join(&admin.join_key().await).await;
    dk.put_agent(agent("watched", "k", 1));
    eventually(20, "a PAT issued", || async { dk.pats().first().map(|_| ()) }).await;
    assert_eq!(n.report(&[("watched", 0, "running", 1)]).await, 204);

    let text = eventually(10, "the placement logged", || async {
        let t = std::fs::read_to_string(&log).ok()?;
        // The PAT's line is written once its commit is done, a moment after IAM answered.
        (t.contains("replica placed") && t.contains("PAT issued and sealed to the node")).then_some(t)
    })
    .await;
    let events: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(events.len() >= 3 && events.len() == text.lines().count(), "every line is JSON");
    let placed = events.iter().find(|e| e["fields"]["message"] == "replica placed").expect("a placement event");
    assert_eq!(placed["fields"]["agent"], "watched");
    assert_eq!(placed["fields"]["node"], "obs-1");
    assert_eq!(placed["fields"]["replica"], 0);
    // Work items run in a span naming their kind and key, instead of each line repeating them.
    let issued = events
        .iter()
        .find(|e| e["fields"]["message"] == "PAT issued and sealed to the node")
        .unwrap_or_else(|| panic!("a PAT event in:\n{text}"));
    assert_eq!(issued["span"]["name"], "work");
    assert_eq!(issued["span"]["kind"], "pat");
    assert_eq!(issued["span"]["agent"], "watched");
    assert_eq!(issued["fields"]["node_name"], "obs-1");

    let m = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap();
    for family in [
        "fleet_nodes{",
        "fleet_placements{",
        "fleet_pass_duration_seconds_bucket",
        "fleet_passes_total",
        "fleet_longpolls_held",
        "fleet_reports_total{outcome=\"accepted\"}",
        "fleet_platform_calls_total{",
        "fleet_pats_total{event=\"issued\"}",
        "fleet_work_queue_depth",
        "fleet_joins_total{outcome=\"joined\"}",
        "fleet_work_duration_seconds_count{kind=\"pat\"}",
        "fleet_work_duration_seconds_count{kind=\"identity\"}",
    ] {
        assert!(m.contains(family), "{family} missing from:\n{m}");
    }
    // The binary allocates through jemalloc: its count of bytes in use covers the controller's
    // heap (runtime, store, HTTP), which a process on another allocator would leave near zero.
    let gauge = |name: &str| -> i64 {
        let line =
            m.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} missing:\n{m}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (allocated, resident) = (gauge("fleet_memory_allocated_bytes"), gauge("fleet_memory_resident_bytes"));
    assert!(allocated > 1 << 20, "jemalloc counts the controller's heap: {allocated} bytes");
    assert!(resident >= allocated, "resident {resident} covers allocated {allocated}");
    let (active, metadata) = (gauge("fleet_memory_active_bytes"), gauge("fleet_memory_metadata_bytes"));
    assert!(active >= allocated && active <= resident, "active {active} between allocated and resident");
    assert!(metadata > 0 && metadata < resident, "metadata {metadata} a part of resident {resident}");
    let api = reqwest::get(format!("{}/metrics", ctl.url)).await.unwrap();
    assert_eq!(api.status(), 404, "metrics stay off the public port");

    // A work item that fails is counted by its kind.
    dk.set_faults(fleet_devkit::Faults { iam_forbidden: true, ..Default::default() });
    dk.put_agent(agent("refused", "k", 1));
    eventually(20, "an identity failure counted", || async {
        let m = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.ok()?.text().await.ok()?;
        let line = m.lines().find(|l| l.starts_with("fleet_work_failures_total{kind=\"identity\"} "))?;
        (line.rsplit(' ').next()?.parse::<u64>().ok()? >= 1).then_some(())
    })
    .await;
}

/// Every series the chart's alerts and dashboard name is one the controller serves
/// (docs/operations.md#alerts-and-the-dashboard): no alert watches a series that does not
/// exist. A family is served from the start, with or without samples (`# TYPE` line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_and_the_dashboard_watch_served_series() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let env = env_for(&dk, dir.path(), free_port(), metrics_port);
    let _ctl = ControllerProcess::spawn(env, dir.path().join("c.log")).await;
    let m = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics")).await.unwrap().text().await.unwrap();
    let families: std::collections::BTreeSet<&str> =
        m.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let files = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/fleet-controller/files");
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(files.join("alerts.yaml")).unwrap()).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(files.join("dashboard.json")).unwrap()).unwrap();
    let mut exprs: Vec<String> = Vec::new();
    for group in alerts["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_string());
        }
    }
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 12, "{exprs:?}");
    let mut checked = 0;
    for expr in &exprs {
        for name in series_in(expr) {
            let family =
                ["_total", "_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
            assert!(families.contains(family), "{expr}: {name} is not served; served: {families:?}");
            checked += 1;
        }
    }
    assert!(checked >= exprs.len(), "every expression names a series");
}

/// The `fleet_…` series names in a PromQL expression.
fn series_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("fleet_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}
