"""Install, upgrade and uninstall the chart for real (`helm install`, not a dry run) on the
throwaway kube-apiserver of `make helm-check`, which runs no controllers: this script stands in
for the Job controller. Whenever Helm creates a hook Job, it checks that everything the Job's pod
needs from the chart (its ServiceAccount, the Secrets it mounts) exists already, then marks the
Job complete so that Helm goes on. Afterwards: the hook-scoped objects are gone once the hooks
are done, the release's own Secret and ServiceAccount are there, and uninstall leaves nothing
of the release behind.

    python ops/k8s/install_check.py --server URL --token TOKEN --kubeconfig FILE \
        --helm HELM --chart CHART [-- helm install flags...]

Exits 1 listing what went wrong. Standard library and PyYAML only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from dry_run import Server

NAMESPACE = "fraud-scorer-install"
RELEASE = "fraud"
HELM_TIMEOUT = "60s"
POLL_INTERVAL_S = 0.2
HOOK = "helm.sh/hook"


class JobController:
    """Completes each hook Job Helm creates, noting what its pod needed and did not find."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.problems: list[str] = []
        self.completed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-controller", daemon=True)

    def __enter__(self) -> JobController:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
        while not self._stop.wait(POLL_INTERVAL_S):
            _status, listing = self.server.call("GET", jobs)
            for job in (listing or {}).get("items", []):
                conditions = (job.get("status") or {}).get("conditions") or []
                if HOOK in (job["metadata"].get("annotations") or {}) and not conditions:
                    self._complete(job)

    def _complete(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        # The namespace's default ServiceAccount comes from a controller this cluster lacks.
        account = pod.get("serviceAccountName", "default")
        needs = [] if account == "default" else [("serviceaccounts", account)]
        needs += [("secrets", v["secret"]["secretName"]) for v in pod["volumes"] if "secret" in v]
        for resource, needed in needs:
            found, _body = self.server.call(
                "GET", f"/api/v1/namespaces/{NAMESPACE}/{resource}/{needed}"
            )
            if found != 200:
                self.problems.append(f"hook Job {name} created before its {resource} {needed}")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        done = {"status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        status = {
            "startTime": now,
            "completionTime": now,
            "succeeded": 1,
            "conditions": [{"type": "SuccessCriteriaMet", **done}, {"type": "Complete", **done}],
        }
        code, body = self.server.call(
            "PATCH", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}/status", {"status": status}
        )
        if code != 200:
            self.problems.append(f"could not complete Job {name}: {code} {body}")
        self.completed.append(name)


def release_objects(server: Server) -> dict[str, bool]:
    """The release's Secrets and ServiceAccounts in the namespace: kind/name → whether it is a
    hook's."""
    found = {}
    selector = f"labelSelector=app.kubernetes.io/instance%3D{RELEASE}"
    for resource in ("secrets", "serviceaccounts"):
        _status, listing = server.call(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/{resource}?{selector}"
        )
        for item in listing["items"]:
            hook = HOOK in (item["metadata"].get("annotations") or {})
            found[f"{resource}/{item['metadata']['name']}"] = hook
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--helm", type=Path, required=True)
    parser.add_argument("--chart", type=Path, required=True)
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        help="+KIND: the installed release must hold one; -KIND: none (capability guards)",
    )
    parser.add_argument("flags", nargs="*", help="helm install/upgrade flags (values)")
    args = parser.parse_args()
    server = Server(args.server, args.token)
    server.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    helm = [str(args.helm), "--kubeconfig", str(args.kubeconfig), "--namespace", NAMESPACE]
    problems: list[str] = []
    with JobController(server) as controller:
        for verb in ("install", "upgrade"):
            started = time.monotonic()
            run = subprocess.run(
                [*helm, verb, RELEASE, str(args.chart), "--timeout", HELM_TIMEOUT, *args.flags],
                capture_output=True,
                text=True,
            )
            took = time.monotonic() - started
            if run.returncode != 0:
                problems.append(f"helm {verb}: {run.stderr.strip()}")
                break
            left = release_objects(server)
            manifest = subprocess.run(
                [*helm, "get", "manifest", RELEASE], capture_output=True, text=True, check=True
            ).stdout
            kinds = sorted({doc["kind"] for doc in yaml.safe_load_all(manifest) if doc})
            for expected in args.expect:
                if (expected[1:] in kinds) != (expected[0] == "+"):
                    problems.append(f"helm {verb}: expected {expected}, installed {kinds}")
            print(f"  ok   helm {verb} in {took:.1f}s: {', '.join(kinds)}; {sorted(left)}")
            if hook_scoped := {name for name, hook in left.items() if hook}:
                problems.append(f"after {verb}, hook-scoped objects remain: {sorted(hook_scoped)}")
        problems += controller.problems
        print(f"       hook Jobs completed: {controller.completed}")
    run = subprocess.run([*helm, "uninstall", RELEASE, "--wait"], capture_output=True, text=True)
    if run.returncode != 0:
        problems.append(f"helm uninstall: {run.stderr.strip()}")
    elif left := release_objects(server):
        problems.append(f"after uninstall, the release left {sorted(left)}")
    else:
        print("  ok   helm uninstall: nothing of the release left")
    for problem in problems:
        print(f"  FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
