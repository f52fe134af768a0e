//! The Kubernetes side of the tests that run the mirror against a real API server
//! (`fleet_devkit::kube`): the shared server with the CRDs applied, a controller's environment
//! with the mirror on, and reads of the mirror objects through the real `kubectl`.

use super::*;
use fleet_devkit::kube::KubeApiServer;

/// The CRDs as `fleet-controller crds` prints them.
pub fn crds() -> String {
    fleet_controller::k8s::crd::crds_yaml()
}

/// The server this test process shares, with the CRDs applied once; `None` (said) when there
/// is none to test against.
pub fn shared(what: &str) -> Option<&'static KubeApiServer> {
    let k = fleet_devkit::kube::shared_or_skip(what)?;
    static APPLIED: std::sync::Once = std::sync::Once::new();
    APPLIED.call_once(|| k.apply(&crds()));
    Some(k)
}

/// A controller's environment with the mirror on, into `namespace` of `k`.
pub fn mirror_env(
    dk: &fleet_devkit::Devkit,
    dir: &Path,
    k: &KubeApiServer,
    namespace: &str,
) -> HashMap<String, String> {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let mut env = env_for(dk, &dir.join("data"), free_port(), free_port());
    env.insert("FLEET_KUBERNETES_MIRROR".into(), "true".into());
    env.insert("FLEET_KUBERNETES_NAMESPACE".into(), namespace.into());
    env.insert("KUBECONFIG".into(), k.kubeconfig().display().to_string());
    env.insert("HOME".into(), dir.display().to_string());
    env
}

/// `kubectl get <what> -o json` in `namespace`, managed fields included; `None` when it does not
/// exist.
pub fn get(k: &KubeApiServer, namespace: &str, what: &str) -> Option<Value> {
    let out = k.kubectl(&["-n", namespace, "get", what, "-o", "json", "--show-managed-fields"]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NotFound"), "kubectl get {what}: {err}");
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("kubectl prints JSON"))
}

/// The names of the objects of `plural` in `namespace` with their uid.
pub fn uids(k: &KubeApiServer, namespace: &str, plural: &str) -> std::collections::BTreeMap<String, String> {
    let list = get(k, namespace, plural).expect("a list always exists");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (o["metadata"]["name"].as_str().unwrap().to_string(), o["metadata"]["uid"].as_str().unwrap().to_string())
        })
        .collect()
}

/// `kubectl` that must succeed, in `namespace`.
pub fn kubectl(k: &KubeApiServer, namespace: &str, args: &[&str]) -> String {
    let mut all = vec!["-n", namespace];
    all.extend_from_slice(args);
    k.kubectl_ok(&all)
}

/// Polls a synchronous read until it returns `Some`.
pub async fn until<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    eventually(secs, what, || {
        let v = f();
        async move { v }
    })
    .await
}

/// The managers of the object's `managedFields` entries that own part of its status.
pub fn status_managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["fieldsV1"].get("f:status").is_some())
        .map(|e| e["manager"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Lines of a log that contain `needle`.
pub fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// A `kubectl get` table as rows of (column, cell): columns start where the header's words do
/// after two spaces or more (a header may hold one space: `LAST SEEN`), and an empty cell is
/// an empty string.
pub fn table(out: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts = vec![0];
    let b = header.as_bytes();
    for i in 2..b.len() {
        if b[i] != b' ' && b[i - 1] == b' ' && b[i - 2] == b' ' {
            starts.push(i);
        }
    }
    let cell = |line: &str, i: usize| -> String {
        let end = starts.get(i + 1).copied().unwrap_or(line.len()).min(line.len());
        line.get(starts[i].min(line.len())..end).unwrap_or("").trim().to_string()
    };
    let names: Vec<String> = (0..starts.len()).map(|i| cell(header, i)).collect();
    lines.map(|l| names.iter().enumerate().map(|(i, n)| (n.clone(), cell(l, i))).collect()).collect()
}

/// Nodes kept reporting (no replicas, every 500 ms) until the value is dropped.
pub struct Reporting(pub tokio::task::JoinHandle<()>);

pub fn reporting(nodes: Vec<TestNode>) -> Reporting {
    Reporting(keep_reporting(nodes))
}

impl Drop for Reporting {
    fn drop(&mut self) {
        self.0.abort();
    }
}
