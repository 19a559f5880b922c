"""Renders the Kubernetes manifests of this folder for `podman kube play`.

    python3 deploy/kubernetes/podman.py [--workers N] [--job] > cluster.yaml

Podman 4.3 runs Pods and Deployments from Kubernetes YAML, but not all of
it; each change made here says why:

- Services are ignored by podman: pods find each other by pod name on the
  network's DNS. A Deployment's pods are named `<deployment>-pod-<i>`, so
  the workers' PRISM_HEAD_ADDRESS becomes the head's pod name.
- `fieldRef: status.podIP` is refused ("not valid or not supported"): it
  is dropped, and each node finds its own address from its route to the
  head (what it does without PRISM_NODE_IP).
- `containerPort`s are published on the host, so two pods with one port
  clash: ports are dropped (the host reaches the pods at their addresses on
  the podman network).
- Probes become health checks run inside the container with curl, which the
  image does not carry: they are dropped, and the run script asks the same
  endpoints from outside.
- `lifecycle.preStop` is not run by podman: dropped (a pod stopped by
  podman gets SIGTERM, on which the node leaves the cluster, as preStop's
  `prism stop` makes it do).
- A PersistentVolumeClaim becomes a volume root owns, and podman ignores
  `fsGroup`, so the image's user could not write the head's state: the
  claim is dropped, and the run script makes the volume of that name
  itself, owned by that user (podman mounts an existing volume by the
  claim's name).
- A Job is not a kind podman plays: with `--job`, it becomes a Pod of the
  same container that runs once.
- Resources are lowered to fit a small machine (one CPU, 1 GiB each).

Everything else (the image, the arguments, the token from a Secret through
`secretKeyRef`, the limits read through `resourceFieldRef`, the security
context, the state volume's claim, replicas) is played as written.
"""

import argparse
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pod_spec(doc):
    if doc["kind"] == "Pod":
        return doc["spec"]
    return doc["spec"]["template"]["spec"]


def adapt(spec, head_pod):
    for c in spec["containers"]:
        c.pop("ports", None)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe", "lifecycle"):
            c.pop(probe, None)
        env = []
        for e in c.get("env", []):
            if "fieldRef" in e.get("valueFrom", {}):
                continue
            if e["name"] == "PRISM_HEAD_ADDRESS":
                e = {"name": e["name"], "value": f"{head_pod}:6380"}
            env.append(e)
        c["env"] = env
        c["imagePullPolicy"] = "Never"
        if "resources" in c:
            small = {"cpu": "1", "memory": "1Gi"}
            c["resources"] = {"requests": dict(small), "limits": dict(small)}
        if "command" in c:
            c["command"] = [
                f"http://{head_pod}:8265" if a == "http://prism-head-svc:8265" else a
                for a in c["command"]
            ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2, help="the worker group's replicas")
    ap.add_argument("--job", action="store_true", help="render job.yaml as a Pod instead")
    args = ap.parse_args()
    with open(os.path.join(HERE, "kustomization.yaml")) as f:
        names = yaml.safe_load(f)["resources"]
    docs = [d for name in names for d in load(name)]
    heads = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "prism-head"]
    if len(heads) != 1:
        sys.exit("podman.py: the manifests must hold one Deployment named prism-head")
    head_pod = "prism-head-pod-0"
    out = []
    if args.job:
        (job,) = load("job.yaml")
        spec = job["spec"]["template"]["spec"]
        adapt(spec, head_pod)
        spec["restartPolicy"] = "Never"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": job["metadata"]["name"], "labels": job["metadata"].get("labels", {})},
                "spec": spec,
            }
        )
    else:
        for d in docs:
            if d["kind"] in ("Service", "PersistentVolumeClaim"):
                continue
            if d["kind"] == "Deployment":
                spec = pod_spec(d)
                replicas = d["spec"].get("replicas", 1)
                if d["metadata"]["name"] == "prism-worker-cpu":
                    replicas = args.workers
                if replicas == 0:
                    continue
                d["spec"]["replicas"] = replicas
                adapt(spec, head_pod)
            out.append(d)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
