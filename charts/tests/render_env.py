"""The controller's environment as the chart renders it, for tests that run the chart's values.

Usage: python3 charts/tests/render_env.py '<values as JSON>'
Prints JSON {"replicas": N, "env": {NAME: value}}: plain values as rendered, a secretKeyRef
read from the Secret the chart rendered beside it, a fieldRef as "$(fieldRef:<path>)" for the
caller to fill in (the pod's name, its IP). Exits 2 naming the variable whose Secret the
chart did not render (an existingSecret the caller must provide itself).
"""

import base64
import json
import os
import sys

import helm_python
import yaml

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fleet-controller")


def render(values):
    chart = helm_python.Chart.load(CHART)
    try:
        out = chart.render(values, name="fleet", namespace="fleet", is_install=True)
    finally:
        chart.close()
    objs = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objs[(doc["kind"], doc["metadata"]["name"])] = doc
    return objs


def secret_value(objs, ref):
    secret = objs.get(("Secret", ref["name"]))
    if secret is None:
        return None
    if ref["key"] in secret.get("stringData", {}):
        return secret["stringData"][ref["key"]]
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def main():
    objs = render(json.loads(sys.argv[1]))
    deployments = [o for (kind, _), o in objs.items() if kind == "Deployment"]
    pod = deployments[0]["spec"]["template"]["spec"]
    env = {}
    for e in pod["containers"][0]["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            value = secret_value(objs, e["valueFrom"]["secretKeyRef"])
            if value is None:
                print(f"{e['name']}: the chart rendered no Secret {e['valueFrom']['secretKeyRef']['name']}",
                      file=sys.stderr)
                sys.exit(2)
            env[e["name"]] = value
        else:
            env[e["name"]] = "$(fieldRef:%s)" % e["valueFrom"]["fieldRef"]["fieldPath"]
    print(json.dumps({"replicas": deployments[0]["spec"]["replicas"], "env": env}))


if __name__ == "__main__":
    main()
