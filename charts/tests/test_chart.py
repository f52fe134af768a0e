"""Chart tests with real Helm (PyPI's helm-python-sdk bundles Helm as a library), offline.

Lint in strict mode, render for the value sets an operator uses and assert on the objects,
check that the schema refuses bad values, and that the chart's CRDs (its crds/ directory) are
the checked-in ones. Rendered offline, the cluster serves no monitoring.coreos.com/v1, so the
ServiceMonitor and the PrometheusRule are skipped: their content is asserted where a real API
server serves them (cluster_chart.py, with install, upgrade and uninstall).
Run: python3 -m unittest discover -s charts/tests -v
"""

import base64
import copy
import json
import os
import unittest

import helm_python
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "charts", "fleet-controller")
with open(os.path.join(CHART, "ci", "test-values.yaml")) as f:
    BASE = yaml.safe_load(f)


def merged(extra=None):
    v = copy.deepcopy(BASE)
    for k, val in (extra or {}).items():
        if isinstance(val, dict) and isinstance(v.get(k), dict):
            v[k] = {**v[k], **val}
        else:
            v[k] = val
    return v


def render(extra=None, namespace="fleet"):
    chart = helm_python.Chart.load(CHART)
    try:
        out = chart.render(merged(extra), name="fleet", namespace=namespace, is_install=True)
    finally:
        chart.close()
    objs = {}
    notes = ""
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objs[(doc["kind"], doc["metadata"]["name"])] = doc
    return objs, notes


def kinds(objs):
    return sorted({k for k, _ in objs})


def env_of(objs):
    c = objs[("Deployment", "fleet-fleet-controller")]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in c["env"]}, c


class Lint(unittest.TestCase):
    def test_strict_lint_is_clean(self):
        report = helm_python.lint(CHART, merged(), strict=True, namespace="fleet")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        self.assertEqual(problems, [], report)

    def test_strict_lint_is_clean_with_every_option_on(self):
        report = helm_python.lint(
            CHART,
            merged({"mirror": {"enabled": True}, "ingress": {"enabled": True}, "serviceMonitor": {"enabled": True},
                    "database": {"url": "postgres://fleet@db/fleet"}, "alerts": {"enabled": True},
                    "dashboard": {"enabled": True}, "networkPolicy": {"nodeCidrs": ["10.0.0.0/8"]},
                    "backup": {"enabled": True}}),
            strict=True,
            namespace="fleet",
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        self.assertEqual(problems, [], report)


class Render(unittest.TestCase):
    def test_defaults(self):
        objs, notes = render()
        self.assertEqual(kinds(objs), ["Deployment", "PersistentVolumeClaim", "Secret", "Service", "ServiceAccount"],
                         "the CRDs are in crds/, not among the templates")
        dep = objs[("Deployment", "fleet-fleet-controller")]
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")
        pod = dep["spec"]["template"]["spec"]
        self.assertEqual(pod["securityContext"]["runAsUser"], 10001)
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertFalse(pod["automountServiceAccountToken"], "no API token in the pod when the mirror is off")
        env, c = env_of(objs)
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"])
        self.assertEqual(c["resources"]["limits"]["memory"], "128Mi")
        for probe in ("livenessProbe", "startupProbe"):
            self.assertEqual(c[probe]["httpGet"], {"path": "/healthz", "port": "api"}, probe)
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "api"})
        self.assertEqual({p["name"]: p["containerPort"] for p in c["ports"]}, {"api": 8040, "metrics": 9040})
        # Every docs/reference.md#controller-environment variable is set (FLEET_DATABASE_URL only when given; the
        # namespace only with the mirror).
        for name in [
            "FLEET_LISTEN", "FLEET_METRICS_LISTEN", "FLEET_DATA_DIR", "FLEET_CONTROL_PLANE_URL", "FLEET_IAM_URL",
            "FLEET_IAM_ISSUER", "FLEET_IAM_TENANT", "FLEET_JWKS_URL", "FLEET_CLIENT_ID", "FLEET_CLIENT_SECRET",
            "FLEET_AUDIENCE", "FLEET_TOKEN_AUDIENCES", "FLEET_TOKEN_SCOPES", "FLEET_TOKEN_TTL_SECONDS",
            "FLEET_RECONCILE_SECONDS", "FLEET_NODE_OFFLINE_SECONDS", "FLEET_NODE_GC_SECONDS", "FLEET_TOKEN_REVOKE_GRACE_SECONDS",
            "FLEET_KUBERNETES_MIRROR", "FLEET_LOG_FORMAT", "RUST_LOG", "FLEET_ROLLOUT_MAX_UNAVAILABLE",
            "FLEET_ROLLOUT_MIN_READY_SECONDS", "FLEET_ROLLOUT_PROGRESS_DEADLINE_SECONDS",
        ]:
            self.assertIn(name, env)
        self.assertEqual(env["FLEET_ROLLOUT_MAX_UNAVAILABLE"]["value"], "25%")
        self.assertEqual(env["FLEET_CONTROL_PLANE_URL"]["value"], "https://cp.example.com")
        self.assertEqual(env["FLEET_TOKEN_TTL_SECONDS"]["value"], "604800")
        self.assertEqual(env["FLEET_KUBERNETES_MIRROR"]["value"], "false")
        self.assertEqual(env["FLEET_DATA_DIR"]["value"], "/data")
        self.assertEqual(env["FLEET_NODE_GC_SECONDS"]["value"], "0", "offline nodes are kept unless asked")
        self.assertEqual(
            env["FLEET_CLIENT_SECRET"]["valueFrom"]["secretKeyRef"],
            {"name": "fleet-fleet-controller-credentials", "key": "client-secret"},
        )
        secret = objs[("Secret", "fleet-fleet-controller-credentials")]
        self.assertEqual(sorted(secret["data"]), ["client-id", "client-secret"])
        self.assertNotIn("s3cret", yaml.safe_dump(dep), "the secret never appears in the Deployment")
        vols = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vols["data"]["persistentVolumeClaim"]["claimName"], "fleet-fleet-controller-data")
        pvc = objs[("PersistentVolumeClaim", "fleet-fleet-controller-data")]
        self.assertEqual(pvc["spec"]["resources"]["requests"]["storage"], "1Gi")
        svc = objs[("Service", "fleet-fleet-controller")]
        self.assertEqual({p["name"]: p["port"] for p in svc["spec"]["ports"]}, {"api": 8040, "metrics": 9040})
        for (kind, name), o in objs.items():
            labels = o["metadata"].get("labels", {})
            for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                      "app.kubernetes.io/managed-by"):
                self.assertIn(k, labels, f"{kind}/{name}")
        self.assertIn("exec deploy/fleet-fleet-controller -- /fleet-controller join-key --ttl 3600", notes)
        # The key goes into the file node.yaml's joinKeyFile names (node.yaml has no joinKey).
        self.assertIn("write the key to the file node.yaml's joinKeyFile names", notes)
        self.assertNotIn("joinKey (", notes)
        self.assertIn("Memory: the limit is 128Mi. A fleet needs about 31 MiB plus\n10 MiB per 1,000 nodes", notes)
        self.assertIn("128Mi fits about 10,000 nodes", notes)
        self.assertIn("WARNING: token.scopes is empty (FLEET_TOKEN_SCOPES)", notes)
        self.assertIn("kubectl -n fleet exec deploy/fleet-fleet-controller", notes)
        self.assertNotIn("get fleetnodes", notes)
        self.assertNotIn(("Role", "fleet-fleet-controller-mirror"), objs, "no RBAC while the mirror is off")

    def test_backup_on_sqlite_runs_beside_the_controller(self):
        objs, _ = render({"backup": {"enabled": True, "keep": 3}})
        self.assertNotIn(("CronJob", "fleet-fleet-controller-backup"), render()[0], "off by default")
        job = objs[("CronJob", "fleet-fleet-controller-backup")]
        self.assertEqual(job["spec"]["schedule"], "17 3 * * *")
        self.assertEqual(job["spec"]["concurrencyPolicy"], "Forbid")
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertEqual(c["image"], "fleet-controller:0.2.0")
        self.assertEqual(c["args"], ["backup", "--out", "/backups/fleet-{time}.sqlite", "--keep", "3"])
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertEqual(pod["securityContext"]["runAsUser"], 10001)
        vols = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vols["data"]["persistentVolumeClaim"]["claimName"], "fleet-fleet-controller-data")
        self.assertEqual(vols["backups"]["persistentVolumeClaim"]["claimName"], "fleet-fleet-controller-backups")
        term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname", "on the node that mounts the data volume")
        self.assertEqual(term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"], "fleet")
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["FLEET_DATA_DIR"]["value"], "/data")
        self.assertNotIn("FLEET_DATABASE_URL", env)
        pvc = objs[("PersistentVolumeClaim", "fleet-fleet-controller-backups")]
        self.assertEqual(pvc["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")

    def test_backup_on_postgresql_reads_the_database_secret(self):
        objs, _ = render({"backup": {"enabled": True, "persistence": {"existingClaim": "my-backups"}},
                          "database": {"url": "postgres://fleet@db/fleet"}})
        pod = objs[("CronJob", "fleet-fleet-controller-backup")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        self.assertEqual(env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"], "fleet-fleet-controller-database")
        vols = {v["name"]: v for v in pod["volumes"]}
        self.assertNotIn("data", vols)
        self.assertNotIn("affinity", pod)
        self.assertEqual(vols["backups"]["persistentVolumeClaim"]["claimName"], "my-backups")
        self.assertNotIn(("PersistentVolumeClaim", "fleet-fleet-controller-backups"), objs)

    def test_mirror_on(self):
        objs, notes = render({"mirror": {"enabled": True}})
        role = objs[("Role", "fleet-fleet-controller-mirror")]
        self.assertEqual(role["metadata"]["namespace"], "fleet")
        rules = {tuple(rule["resources"]): rule["verbs"] for rule in role["rules"]}
        self.assertEqual(rules, {("fleetnodes", "fleetplacements"): ["get", "list", "watch", "create", "patch", "delete"],
                                 ("fleetnodes/status", "fleetplacements/status"): ["patch"]},
                         "exactly the verbs the mirror uses (its start-up check asks for these)")
        binding = objs[("RoleBinding", "fleet-fleet-controller-mirror")]
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": "fleet-fleet-controller", "namespace": "fleet"}])
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_KUBERNETES_MIRROR"]["value"], "true")
        self.assertEqual(env["FLEET_KUBERNETES_NAMESPACE"]["value"], "fleet")
        self.assertNotIn("FLEET_ID", env, "the id kept in the store unless set")
        pod = objs[("Deployment", "fleet-fleet-controller")]["spec"]["template"]["spec"]
        self.assertTrue(pod["automountServiceAccountToken"])
        self.assertIn("kubectl -n fleet get fleetnodes", notes)
        self.assertIn("one\nerror line in the controller's log naming the fix", notes)
        # Mirrors in another namespace: the Role goes there; a fleet id of the operator's.
        objs, _ = render({"mirror": {"enabled": True, "namespace": "fleet-mirror", "fleetId": "prod"}})
        self.assertEqual(objs[("Role", "fleet-fleet-controller-mirror")]["metadata"]["namespace"], "fleet-mirror")
        self.assertEqual(env_of(objs)[0]["FLEET_ID"]["value"], "prod")

    def test_scopes_set_silence_the_warning(self):
        objs, notes = render({"token": {"scopes": ["control-plane:read", "control-plane:write"]}})
        self.assertNotIn("token.scopes is empty", notes)
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_TOKEN_SCOPES"]["value"], "control-plane:read control-plane:write")

    def test_ingress_on(self):
        objs, notes = render({"ingress": {"enabled": True, "className": "nginx", "hosts": [{"host": "fleet.corp", "paths": [{"path": "/", "pathType": "Prefix"}]}],
                                          "tls": [{"hosts": ["fleet.corp"], "secretName": "fleet-tls"}]}})
        ing = objs[("Ingress", "fleet-fleet-controller")]
        self.assertEqual(ing["spec"]["ingressClassName"], "nginx")
        rule = ing["spec"]["rules"][0]
        self.assertEqual(rule["host"], "fleet.corp")
        self.assertEqual(rule["http"]["paths"][0]["backend"]["service"], {"name": "fleet-fleet-controller", "port": {"name": "api"}})
        self.assertEqual(ing["spec"]["tls"][0]["secretName"], "fleet-tls")
        self.assertIn("https://fleet.corp", notes)

    def test_existing_secret(self):
        objs, _ = render({"credentials": {"existingSecret": "platform-creds", "clientIdKey": "id", "clientSecretKey": "secret",
                                          "clientId": "", "clientSecret": ""}})
        self.assertNotIn("Secret", kinds(objs))
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_CLIENT_ID"]["valueFrom"]["secretKeyRef"], {"name": "platform-creds", "key": "id"})
        self.assertEqual(env["FLEET_CLIENT_SECRET"]["valueFrom"]["secretKeyRef"], {"name": "platform-creds", "key": "secret"})

    def test_no_credentials_warns_in_notes(self):
        objs, notes = render({"credentials": {"clientId": "", "clientSecret": ""}})
        env, _ = env_of(objs)
        self.assertNotIn("FLEET_CLIENT_ID", env)
        self.assertIn("503 not_configured", notes)

    def test_persistence_off(self):
        objs, _ = render({"persistence": {"enabled": False}})
        self.assertNotIn("PersistentVolumeClaim", kinds(objs))
        pod = objs[("Deployment", "fleet-fleet-controller")]["spec"]["template"]["spec"]
        self.assertEqual({v["name"]: v for v in pod["volumes"]}["data"], {"name": "data", "emptyDir": {}})

    def test_ha_on_postgresql(self):
        url = "postgres://fleet:s3cret@db.example.com/fleet"
        objs, _ = render({"database": {"url": url}})
        self.assertEqual(
            kinds(objs),
            ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"],
            "no PersistentVolumeClaim",
        )
        dep = objs[("Deployment", "fleet-fleet-controller")]
        self.assertEqual(dep["spec"]["replicas"], 3)
        self.assertEqual(dep["spec"]["strategy"]["type"], "RollingUpdate")
        pdb = objs[("PodDisruptionBudget", "fleet-fleet-controller")]
        self.assertEqual(pdb["spec"]["maxUnavailable"], 1)
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        secret = objs[("Secret", "fleet-fleet-controller-database")]
        self.assertEqual(base64.b64decode(secret["data"]["database-url"]).decode(), url)
        env, c = env_of(objs)
        self.assertEqual(env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"],
                         {"name": "fleet-fleet-controller-database", "key": "database-url"})
        self.assertNotIn("s3cret", yaml.safe_dump(dep), "the password stays in the Secret")
        self.assertEqual(env["FLEET_REPLICA_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(env["FLEET_ADVERTISE_URL"]["value"], "http://$(POD_IP):8040")
        names = [e["name"] for e in c["env"]]
        self.assertLess(names.index("POD_IP"), names.index("FLEET_ADVERTISE_URL"), "$(POD_IP) is defined first")
        self.assertEqual(env["FLEET_LEADER_LEASE_SECONDS"]["value"], "15")
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "api"})
        pod = dep["spec"]["template"]["spec"]
        self.assertEqual({v["name"]: v for v in pod["volumes"]}["data"], {"name": "data", "emptyDir": {}})

    def test_ha_generates_the_replica_secret_and_a_network_policy(self):
        objs, _ = render({"database": {"url": "postgres://fleet@db/fleet"},
                          "networkPolicy": {"nodeCidrs": ["10.20.0.0/16"], "metricsFrom": [{"namespaceSelector": {}}]}})
        secret = objs[("Secret", "fleet-fleet-controller-replica")]
        value = base64.b64decode(secret["data"]["replica-secret"]).decode()
        self.assertGreaterEqual(len(value), 32, "long enough for the controller")
        self.assertEqual(secret["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_REPLICA_SECRET"]["valueFrom"]["secretKeyRef"],
                         {"name": "fleet-fleet-controller-replica", "key": "replica-secret"})
        pol = objs[("NetworkPolicy", "fleet-fleet-controller")]
        dep = objs[("Deployment", "fleet-fleet-controller")]
        self.assertEqual(pol["spec"]["podSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"])
        api, metrics = pol["spec"]["ingress"]
        self.assertEqual(api["ports"], [{"port": 8040, "protocol": "TCP"}])
        self.assertEqual(api["from"], [
            {"podSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
            {"ipBlock": {"cidr": "10.20.0.0/16"}},
        ])
        self.assertEqual(metrics, {"ports": [{"port": 9040, "protocol": "TCP"}], "from": [{"namespaceSelector": {}}]})
        objs, _ = render({"database": {"url": "postgres://fleet@db/fleet"},
                          "replicaSecret": {"existingSecret": "mine", "key": "k"}, "networkPolicy": {"enabled": False}})
        self.assertNotIn(("Secret", "fleet-fleet-controller-replica"), objs)
        self.assertNotIn(("NetworkPolicy", "fleet-fleet-controller"), objs)
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_REPLICA_SECRET"]["valueFrom"]["secretKeyRef"], {"name": "mine", "key": "k"})
        objs, _ = render({})
        self.assertNotIn("FLEET_REPLICA_SECRET", env_of(objs)[0], "one SQLite pod forwards nothing")
        self.assertNotIn("NetworkPolicy", kinds(objs))

    def test_monitoring_kinds_are_skipped_where_not_served_and_the_notes_say_so(self):
        objs, notes = render({"alerts": {"enabled": True}, "serviceMonitor": {"enabled": True},
                              "dashboard": {"enabled": True}})
        self.assertNotIn("PrometheusRule", kinds(objs))
        self.assertNotIn("ServiceMonitor", kinds(objs))
        self.assertIn("SKIPPED: alerts.enabled=true, but this cluster does not serve monitoring.coreos.com/v1\n"
                      "PrometheusRule", notes)
        self.assertIn("SKIPPED: serviceMonitor.enabled=true, but this cluster does not serve\n"
                      "monitoring.coreos.com/v1 ServiceMonitor", notes)
        cm = objs[("ConfigMap", "fleet-fleet-controller-dashboard")]
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        dash = json.loads(cm["data"]["fleet.json"])
        # What Grafana's dashboard model requires of a dashboard and its panels.
        self.assertTrue(dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int))
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")
        for p in dash["panels"]:
            self.assertIn(p["type"], {"timeseries", "stat", "gauge", "table"})
            self.assertEqual(set(p["gridPos"]), {"h", "w", "x", "y"})
            self.assertLessEqual(p["gridPos"]["x"] + p["gridPos"]["w"], 24)
            self.assertTrue(p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]))
        objs, notes = render({})
        self.assertNotIn(("ConfigMap", "fleet-fleet-controller-dashboard"), objs)
        self.assertNotIn("SKIPPED", notes)

    def test_ha_with_an_existing_secret_and_five_replicas(self):
        objs, _ = render({"database": {"existingSecret": "pg", "urlKey": "url"}, "replicas": 5,
                          "podDisruptionBudget": {"maxUnavailable": 2}})
        self.assertNotIn(("Secret", "fleet-fleet-controller-database"), objs)
        self.assertEqual(objs[("Deployment", "fleet-fleet-controller")]["spec"]["replicas"], 5)
        self.assertEqual(objs[("PodDisruptionBudget", "fleet-fleet-controller")]["spec"]["maxUnavailable"], 2)
        env, _ = env_of(objs)
        self.assertEqual(env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"], {"name": "pg", "key": "url"})

    def test_replicas_alone_keep_one_sqlite_pod(self):
        objs, _ = render({"replicas": 3})
        dep = objs[("Deployment", "fleet-fleet-controller")]
        self.assertEqual((dep["spec"]["replicas"], dep["spec"]["strategy"]["type"]), (1, "Recreate"))
        self.assertNotIn("PodDisruptionBudget", kinds(objs))

    def test_old_crds_values_still_install_and_the_notes_say_they_are_not_read(self):
        objs, notes = render({"crds": {"install": False}})
        self.assertIn("NOTE: crds.* is no longer read (chart 0.2.0)", notes)
        self.assertIn("Deployment", kinds(objs))
        self.assertIn("helm show crds <this chart> | kubectl apply --server-side --force-conflicts -f -", notes)

    def test_required_values_are_named(self):
        v = merged()
        v["controlPlane"] = {"url": ""}
        chart = helm_python.Chart.load(CHART)
        try:
            with self.assertRaises(helm_python.HelmError) as e:
                chart.render(v, name="fleet", namespace="fleet")
        finally:
            chart.close()
        self.assertIn("controlPlane.url is required", str(e.exception))


class Schema(unittest.TestCase):
    def refused(self, extra, needle):
        chart = helm_python.Chart.load(CHART)
        try:
            with self.assertRaises(helm_python.HelmError, msg=str(extra)) as e:
                chart.render(merged(extra), name="fleet", namespace="fleet")
        finally:
            chart.close()
        self.assertIn(needle, str(e.exception))

    def test_bad_values_are_refused(self):
        self.refused({"token": {"ttlSeconds": 60}}, "ttlSeconds")
        self.refused({"log": {"format": "xml"}}, "format")
        self.refused({"mirror": {"enabled": "yes"}}, "enabled")
        self.refused({"service": {"port": 70000}}, "port")
        self.refused({"persistence": {"size": "lots"}}, "size")
        self.refused({"controlPlane": {"url": "cp.example.com"}}, "url")
        self.refused({"replicas": 0}, "replicas")
        self.refused({"database": {"url": "mysql://db/fleet"}}, "url")
        self.refused({"leaderLeaseSeconds": 1}, "leaderLeaseSeconds")
        self.refused({"rollout": {"maxUnavailable": "150%"}}, "maxUnavailable")
        self.refused({"rollout": {"progressDeadlineSeconds": 0}}, "progressDeadlineSeconds")
        self.refused({"mirror": {"namespace": "Fleet_1"}}, "namespace")
        self.refused({"mirror": {"fleetId": "a/b"}}, "fleetId")
        self.refused({"backup": {"keep": 0}}, "keep")
        self.refused({"backup": {"enabled": True}, "persistence": {"enabled": False}}, "emptyDir store cannot be backed up")


class Crds(unittest.TestCase):
    def test_the_charts_crds_directory_holds_the_checked_in_crds(self):
        with open(os.path.join(ROOT, "crds", "fleet.taimen.dev.yaml")) as f:
            checked_in = f.read()
        with open(os.path.join(CHART, "crds", "fleet.taimen.dev.yaml")) as f:
            self.assertEqual(f.read(), checked_in, "copy crds/fleet.taimen.dev.yaml to charts/fleet-controller/crds/")
        chart = helm_python.Chart.load(CHART)
        try:
            crds = chart.crds
        finally:
            chart.close()
        self.assertEqual([c["filename"] for c in crds], ["fleet-controller/crds/fleet.taimen.dev.yaml"],
                         "Helm sees them as the chart's CRDs")
        names = sorted(d["metadata"]["name"] for d in yaml.safe_load_all(checked_in) if d)
        self.assertEqual(names, ["fleetnodes.fleet.taimen.dev", "fleetplacements.fleet.taimen.dev"])


if __name__ == "__main__":
    unittest.main()
