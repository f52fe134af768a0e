"""The chart installed, upgraded and uninstalled with real Helm (helm-python-sdk) on a real API
server (docs/operations.md#the-kubernetes-mirror-and-its-crds).

Every ordinary order: the CRDs applied with kubectl first, a second release in another
namespace, a new release after an uninstall, a cluster without the CRDs, an upgrade whose CRDs
changed; the monitoring kinds only where the cluster serves them; the default, mirror, HA and
HA-with-mirror values through install, upgrade and uninstall; and the chart's Role under real
RBAC, with a real ServiceAccount token, for `fleet-controller dev` mirroring into the cluster.

The API server has no kubelet: Deployments make no pods, so the controller itself runs outside,
with the token of the ServiceAccount the chart made. operator/tests/chart.rs starts the server
and runs this file with FLEET_CHART_KUBECONFIG (its admin kubeconfig) and FLEET_CONTROLLER_BIN.
Run: FLEET_CHART_KUBECONFIG=… python3 charts/tests/cluster_chart.py -v
"""

import copy
import itertools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import helm_python
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "charts", "fleet-controller")
CRDS = os.path.join(ROOT, "crds", "fleet.taimen.dev.yaml")
KUBECONFIG = os.environ.get("FLEET_CHART_KUBECONFIG", "")
CRD_NAMES = ["fleetnodes.fleet.taimen.dev", "fleetplacements.fleet.taimen.dev"]
with open(os.path.join(CHART, "ci", "test-values.yaml")) as f:
    BASE = yaml.safe_load(f)
MIRROR = {"mirror": {"enabled": True}}
HA = {"database": {"url": "postgres://fleet:s3cret@db.example.com/fleet"}}
HA_MIRROR = {**HA, **MIRROR}
MONITORING_KINDS = [("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")]
_names = itertools.count()


def setUpModule():
    if not KUBECONFIG:
        raise unittest.SkipTest("FLEET_CHART_KUBECONFIG is not set: operator/tests/chart.rs starts an API server")


def values(*extra):
    v = copy.deepcopy(BASE)
    for e in extra:
        v.update(copy.deepcopy(e))
    return v


def kubectl(*args, stdin=None, check=True):
    r = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                       env={**os.environ, "KUBECONFIG": KUBECONFIG})
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
    return r


def get(ns, what):
    """The object as JSON, or None when it does not exist."""
    r = kubectl("-n", ns, "get", what, "-o", "json", check=False)
    if r.returncode != 0:
        assert "NotFound" in r.stderr, r.stderr
        return None
    return json.loads(r.stdout)


def namespace(prefix):
    name = f"{prefix}-{next(_names)}"
    kubectl("create", "namespace", name)
    return name


def helm(ns):
    return helm_python.Config(kubeconfig_path=KUBECONFIG, namespace=ns)


def install(ns, name, vals, chart=CHART):
    with helm(ns) as cfg:
        return cfg.install(chart, name, vals, namespace=ns)


def upgrade(ns, name, vals, chart=CHART):
    with helm(ns) as cfg:
        return cfg.upgrade(chart, name, vals)


def uninstall(ns, name):
    with helm(ns) as cfg:
        return cfg.uninstall(name)


def apply_crds(path=CRDS):
    """What the docs tell an operator: server-side, taking the fields over from Helm."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", path)
    kubectl("wait", "--for=condition=Established", *[f"crd/{n}" for n in CRD_NAMES])


def delete_crds():
    kubectl("delete", "crd", *CRD_NAMES, "--ignore-not-found", "--wait=true")


def crd(name):
    r = kubectl("get", "crd", name, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def wait_for(what, f, seconds=30):
    deadline = time.time() + seconds
    while True:
        v = f()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


class CrdOrders(unittest.TestCase):
    """Show 4 of the issue: every ordinary order installs."""

    def test_install_after_the_crds_were_applied_with_kubectl(self):
        delete_crds()
        apply_crds()
        ns = namespace("kubectl-first")
        r = install(ns, "fleet", values(MIRROR))
        self.assertEqual(r["status"], "deployed")
        for name in CRD_NAMES:
            annotations = crd(name)["metadata"].get("annotations", {})
            self.assertNotIn("meta.helm.sh/release-name", annotations, "Helm adopted nothing")

    def test_a_second_release_in_another_namespace(self):
        apply_crds()
        one, two = namespace("first"), namespace("second")
        self.assertEqual(install(one, "fleet", values(MIRROR))["status"], "deployed")
        self.assertEqual(install(two, "fleet", values(MIRROR))["status"], "deployed")
        for ns in (one, two):
            self.assertIsNotNone(get(ns, "role/fleet-fleet-controller-mirror"))

    def test_a_new_release_after_an_uninstall_under_another_name(self):
        apply_crds()
        ns = namespace("again")
        install(ns, "old", values(MIRROR))
        uninstall(ns, "old")
        for name in CRD_NAMES:
            self.assertIsNotNone(crd(name), "the CRDs are kept on uninstall")
        self.assertIsNone(get(ns, "deployment/old-fleet-controller"))
        self.assertEqual(install(ns, "new", values(MIRROR))["status"], "deployed")

    def test_a_cluster_without_the_crds_gets_them_from_the_charts_crds_directory(self):
        delete_crds()
        ns = namespace("no-crds")
        install(ns, "fleet", values())
        for name in CRD_NAMES:
            self.assertIsNotNone(crd(name), f"{name} installed by helm install")
        uninstall(ns, "fleet")
        for name in CRD_NAMES:
            self.assertIsNotNone(crd(name), f"{name} kept by helm uninstall")

    def test_an_upgrade_whose_crds_changed_after_applying_them_as_the_docs_say(self):
        delete_crds()
        ns = namespace("crd-upgrade")
        install(ns, "fleet", values(MIRROR))  # Helm makes the CRDs (its field manager owns them)
        with tempfile.TemporaryDirectory() as tmp:
            new = shutil.copytree(CHART, os.path.join(tmp, "fleet-controller"))
            crd_file = os.path.join(new, "crds", "fleet.taimen.dev.yaml")
            with open(crd_file) as f:
                text = f.read()
            marker = "A Docker host joined to Fleet"
            self.assertIn(marker, text)
            with open(crd_file, "w") as f:
                f.write(text.replace(marker, marker + " (next version)"))
            chart_file = os.path.join(new, "Chart.yaml")
            with open(chart_file) as f:
                meta = yaml.safe_load(f)
            meta["version"] = meta["version"] + "-next"
            with open(chart_file, "w") as f:
                yaml.safe_dump(meta, f)
            described = lambda: json.dumps(crd("fleetnodes.fleet.taimen.dev")["spec"]["versions"][0]["schema"])
            r = upgrade(ns, "fleet", values(MIRROR), chart=new)
            self.assertEqual(r["revision"], 2)
            self.assertNotIn("(next version)", described(), "helm upgrade never changes crds/")
            apply_crds(os.path.join(new, "crds"))
            self.assertIn("(next version)", described())
            self.assertEqual(upgrade(ns, "fleet", values(MIRROR), chart=new)["revision"], 3)
        apply_crds()


class Monitoring(unittest.TestCase):
    """ServiceMonitor and PrometheusRule only where monitoring.coreos.com/v1 is served."""

    def tearDown(self):
        kubectl("delete", "crd", *[f"{p}.monitoring.coreos.com" for _, p in MONITORING_KINDS], "--ignore-not-found")

    def test_made_only_where_the_prometheus_operators_kinds_are_served(self):
        apply_crds()
        ns = namespace("monitoring")
        vals = values({"alerts": {"enabled": True, "labels": {"release": "prom"}}, "serviceMonitor": {"enabled": True},
                       "reconcileSeconds": 60})
        r = install(ns, "fleet", vals)
        self.assertEqual(r["status"], "deployed")
        self.assertIn("SKIPPED: alerts.enabled=true", r["notes"])
        self.assertIn("SKIPPED: serviceMonitor.enabled=true", r["notes"])
        self.assertNotIn("PrometheusRule", r["manifest"])
        for kind, plural in MONITORING_KINDS:
            kubectl("apply", "-f", "-", stdin=yaml.safe_dump(monitoring_crd(kind, plural)))
        wait_for("monitoring.coreos.com/v1 served",
                 lambda: all(k in kubectl("api-resources", "--api-group=monitoring.coreos.com").stdout
                             for k, _ in MONITORING_KINDS))
        r = upgrade(ns, "fleet", vals)
        self.assertNotIn("SKIPPED", r["notes"])
        sm = get(ns, "servicemonitor/fleet-fleet-controller")
        self.assertEqual(sm["spec"]["endpoints"], [{"port": "metrics", "path": "/metrics", "interval": "30s"}])
        rule = get(ns, "prometheusrule/fleet-fleet-controller")
        self.assertEqual(rule["metadata"]["labels"]["release"], "prom")
        alerts = {a["alert"]: a for g in rule["spec"]["groups"] for a in g["rules"]}
        self.assertEqual(sorted(alerts), ["FleetLeaderFlapping", "FleetNoLeader", "FleetNodesOffline",
                                          "FleetPassStalled", "FleetPatIssuanceFailing", "FleetRolloutHalted",
                                          "FleetWorkBacklog"])
        self.assertIn("increase(fleet_passes_total[180s])", alerts["FleetPassStalled"]["expr"], "three periods")
        self.assertIn("> 0.1", alerts["FleetNodesOffline"]["expr"])
        self.assertIn("{{ $value | humanizePercentage }}", alerts["FleetNodesOffline"]["annotations"]["summary"],
                      "Prometheus's own templates pass through Helm untouched")
        uninstall(ns, "fleet")
        self.assertIsNone(get(ns, "prometheusrule/fleet-fleet-controller"))


def monitoring_crd(kind, plural):
    """The Prometheus Operator's CRD of `kind`, reduced to what the API server needs to serve it."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


class ValueSets(unittest.TestCase):
    """The default, mirror, HA and HA-with-mirror values: install, upgrade, uninstall."""

    def lifecycle(self, prefix, extra, replicas, mirror):
        apply_crds()
        ns = namespace(prefix)
        r = install(ns, "fleet", values(extra))
        self.assertEqual(r["status"], "deployed")
        dep = get(ns, "deployment/fleet-fleet-controller")
        self.assertEqual(dep["spec"]["replicas"], replicas)
        self.assertEqual(get(ns, "role/fleet-fleet-controller-mirror") is not None, mirror)
        self.assertEqual(get(ns, "rolebinding/fleet-fleet-controller-mirror") is not None, mirror)
        r = upgrade(ns, "fleet", values(extra, {"log": {"format": "json", "level": "debug"}}))
        self.assertEqual((r["revision"], r["status"]), (2, "deployed"))
        env = {e["name"]: e.get("value") for e in
               get(ns, "deployment/fleet-fleet-controller")["spec"]["template"]["spec"]["containers"][0]["env"]}
        self.assertEqual(env["RUST_LOG"], "debug")
        self.assertEqual(env["FLEET_KUBERNETES_MIRROR"], "true" if mirror else "false")
        uninstall(ns, "fleet")
        for what in ("deployment/fleet-fleet-controller", "service/fleet-fleet-controller",
                     "serviceaccount/fleet-fleet-controller", "role/fleet-fleet-controller-mirror"):
            self.assertIsNone(get(ns, what), f"{what} removed by uninstall")
        return ns

    def test_default_values(self):
        self.lifecycle("default", {}, 1, False)

    def test_mirror_values(self):
        self.lifecycle("mirror", MIRROR, 1, True)

    def test_ha_values(self):
        ns = self.lifecycle("ha", HA, 3, False)
        kept = get(ns, "secret/fleet-fleet-controller-replica")
        self.assertIsNotNone(kept, "the replicas' secret outlives the release (resource policy keep)")

    def test_ha_with_mirror_values(self):
        ns = self.lifecycle("ha-mirror", HA_MIRROR, 3, True)
        self.assertIsNotNone(get(ns, "secret/fleet-fleet-controller-replica"))


class RoleUnderRealRbac(unittest.TestCase):
    """The chart's Role suffices, and no more is granted, for its ServiceAccount's own token."""

    def test_the_service_account_may_do_what_the_mirror_does_and_no_more(self):
        apply_crds()
        ns = namespace("rbac")
        install(ns, "fleet", values(HA_MIRROR))
        sa = f"system:serviceaccount:{ns}:fleet-fleet-controller"
        for resource, verbs in [("fleetnodes", ["get", "list", "watch", "create", "patch", "delete"]),
                                ("fleetplacements", ["get", "list", "watch", "create", "patch", "delete"]),
                                ("fleetnodes/status", ["patch"]), ("fleetplacements/status", ["patch"])]:
            for verb in verbs:
                r = kubectl("auth", "can-i", verb, f"{resource}.fleet.taimen.dev", "-n", ns, "--as", sa, check=False)
                self.assertEqual(r.stdout.strip(), "yes", f"{verb} {resource}")
        for verb, what in [("update", "fleetnodes.fleet.taimen.dev"), ("get", "secrets"), ("list", "pods"),
                           ("create", "customresourcedefinitions.apiextensions.k8s.io")]:
            r = kubectl("auth", "can-i", verb, what, "-n", ns, "--as", sa, check=False)
            self.assertEqual(r.stdout.strip(), "no", f"{verb} {what} is not granted")
        other = namespace("elsewhere")
        r = kubectl("auth", "can-i", "create", "fleetnodes.fleet.taimen.dev", "-n", other, "--as", sa, check=False)
        self.assertEqual(r.stdout.strip(), "no", "only in its own namespace")

    @unittest.skipUnless(os.environ.get("FLEET_CONTROLLER_BIN"), "FLEET_CONTROLLER_BIN is not set")
    def test_dev_mirrors_with_the_token_of_the_charts_service_account(self):
        apply_crds()
        ns = namespace("sa-token")
        install(ns, "fleet", values(MIRROR))
        token = kubectl("-n", ns, "create", "token", "fleet-fleet-controller").stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            config = service_account_kubeconfig(token, ns)
            path = os.path.join(tmp, "kubeconfig")
            with open(path, "w") as f:
                yaml.safe_dump(config, f)
            ports = [free_port() for _ in range(3)]
            with open(os.path.join(tmp, "dev.log"), "w+") as log:
                dev = subprocess.Popen(
                    [os.environ["FLEET_CONTROLLER_BIN"], "dev", "--dir", os.path.join(tmp, "dev"),
                     "--listen", f"127.0.0.1:{ports[0]}", "--metrics-listen", f"127.0.0.1:{ports[1]}",
                     "--devkit-listen", f"127.0.0.1:{ports[2]}"],
                    env={"HOME": tmp, "KUBECONFIG": path, "FLEET_KUBERNETES_MIRROR": "true"},
                    stdout=subprocess.DEVNULL, stderr=log)
                try:
                    wait_for("the dev fleet's pending agents mirrored with the ServiceAccount's token",
                             lambda: {"coder.pending", "reviewer.pending"} <= placements(ns))
                finally:
                    dev.terminate()
                    dev.wait(10)
                    log.seek(0)
                    text = log.read()
            self.assertNotIn(" ERROR ", text, text)
            self.assertIn(f"Kubernetes mirror on: FleetNode and FleetPlacement objects follow the store namespace={ns}",
                          text)


def placements(ns):
    items = json.loads(kubectl("-n", ns, "get", "fleetplacements", "-o", "json").stdout)["items"]
    return {i["metadata"]["name"] for i in items}


def service_account_kubeconfig(token, ns):
    """The admin kubeconfig's cluster with the ServiceAccount's token, in its namespace."""
    with open(KUBECONFIG) as f:
        admin = yaml.safe_load(f)
    cluster = admin["clusters"][0]
    return {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa", "namespace": ns}}],
            "current-context": "sa"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    unittest.main()
