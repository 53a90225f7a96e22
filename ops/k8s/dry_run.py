"""Have a real kube-apiserver accept rendered manifests: a server-side dry run with strict field
validation, so every object is checked against the server's own schemas (built-in kinds) and the
CRDs' OpenAPI schemas (KEDA, Prometheus Operator), admission and defaulting included, and
nothing is stored.

    python ops/k8s/dry_run.py --server https://127.0.0.1:PORT --token TOKEN \
        --crd keda.sh_scaledobjects.yaml ... MANIFEST.yaml ...

Exits 1 listing every object the server rejected. Standard library and PyYAML only.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "fraud-scorer-check"
CRD_ESTABLISHED_TIMEOUT_S = 60.0


class Server:
    """The API server of a local, throwaway cluster (self-signed certificate on loopback)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        patch = method == "PATCH"
        request.add_header("Content-Type", f"application/{'merge-patch+' if patch else ''}json")
        try:
            with urllib.request.urlopen(request, context=self.tls, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def resource_path(self, api_version: str, kind: str) -> tuple[str, bool]:
        """The collection path of a kind (from discovery) and whether it is namespaced."""
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        status, listing = self.call("GET", prefix)
        if status != 200:
            raise LookupError(f"{api_version}: the server does not serve it ({status})")
        for resource in listing["resources"]:
            if resource["kind"] == kind and "/" not in resource["name"]:
                return f"{prefix}/{resource['name']}", bool(resource["namespaced"])
        raise LookupError(f"{api_version}: no kind {kind}")


def documents(paths: list[Path]) -> list[dict[str, Any]]:
    return [
        doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc is not None
    ]


def install_crds(server: Server, paths: list[Path]) -> None:
    for crd in documents(paths):
        status, body = server.call(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
        )
        if status not in (201, 409):
            raise RuntimeError(f"CRD {crd['metadata']['name']}: {status} {body.get('message')}")
    deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_S
    for crd in documents(paths):
        name = crd["metadata"]["name"]
        while True:
            _status, body = server.call(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = {
                c["type"]: c["status"] for c in body.get("status", {}).get("conditions", [])
            }
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not established after {CRD_ESTABLISHED_TIMEOUT_S}s")
            time.sleep(0.5)


def dry_run(server: Server, manifest: dict[str, Any]) -> str | None:
    """None if the server accepts the object, else why not."""
    kind, api_version = manifest["kind"], manifest["apiVersion"]
    try:
        collection, namespaced = server.resource_path(api_version, kind)
    except LookupError as error:
        return str(error)
    if namespaced:
        group_prefix, resource = collection.rsplit("/", 1)
        collection = f"{group_prefix}/namespaces/{NAMESPACE}/{resource}"
    status, body = server.call("POST", f"{collection}?dryRun=All&fieldValidation=Strict", manifest)
    if status in (200, 201):
        return None
    return f"{status} {body.get('message') if isinstance(body, dict) else body}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--crd", type=Path, action="append", default=[])
    parser.add_argument(
        "--must-reject",
        action="store_true",
        help="negative controls: succeed only if the server rejects every object",
    )
    parser.add_argument("manifests", type=Path, nargs="+")
    args = parser.parse_args()
    server = Server(args.server, args.token)
    install_crds(server, args.crd)
    server.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    failures = 0
    for path in args.manifests:
        for manifest in documents([path]):
            name = f"{path.name}: {manifest['kind']}/{manifest['metadata']['name']}"
            problem = dry_run(server, manifest)
            if args.must_reject:
                verdict = "ok   rejected" if problem else "FAIL accepted"
                failures += problem is None
            else:
                verdict = "ok  " if problem is None else "FAIL"
                failures += problem is not None
            print(f"  {verdict} {name}" + (f": {problem}" if problem else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
