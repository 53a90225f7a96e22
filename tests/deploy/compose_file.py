"""docker-compose.yml as the deploy tests read it: the file (and an override merged over it)
with its `${NAME:-default}` interpolation resolved to the defaults, as on a machine with no
.env, and the services, environments and mounts the tests look at."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from tests.deploy.repo import ROOT, config_default

COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
STANDINS = ROOT / "ops" / "compose" / "standins.yml"

#: Services whose names other files rely on (Prometheus DNS, the loadgen's metrics URL, README).
SCORER, TOPICS, LOADGEN, KAFKA, REPORTS = "scorer", "topics", "loadgen", "kafka", "reports"
PROMETHEUS_SERVICE = "prometheus"


_DEFAULTED = re.compile(r"\$\{(?P<name>\w+):?-(?P<default>[^}]*)\}")


def interpolate(value: Any) -> Any:
    """Resolve compose interpolation to the defaults; a variable without a default fails."""
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if not isinstance(value, str):
        return value
    resolved = _DEFAULTED.sub(lambda m: m.group("default"), value)
    assert "$" not in resolved.replace("$$", ""), (
        f"{value!r}: every compose variable needs a default (${{NAME:-default}}), so the stack "
        "runs without a .env file"
    )
    return resolved.replace("$$", "$")


@cache
def raw_compose(path: Path = COMPOSE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict), path
    return document


@cache
def compose(path: Path = COMPOSE) -> dict[str, Any]:
    resolved = interpolate(raw_compose(path))
    assert isinstance(resolved, dict)
    return resolved


def service(name: str, path: Path = COMPOSE) -> dict[str, Any]:
    services = compose(path)["services"]
    assert name in services, f"{path.name} has no service {name!r}"
    result = services[name]
    assert isinstance(result, dict)
    return result


def merged_service(name: str) -> dict[str, Any]:
    """The service as `docker compose -f docker-compose.yml -f docker-compose.gpu.yml` sees it
    (mappings merged key by key, anything else replaced: enough for what is checked here)."""

    def merge(base: Any, override: Any) -> Any:
        if not (isinstance(base, dict) and isinstance(override, dict)):
            return override
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged

    result = merge(service(name), service(name, GPU_OVERRIDE))
    assert isinstance(result, dict)
    return result


def environment(svc: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container sees it (list or mapping form)."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    result: dict[str, str] = {}
    for key, value in env.items():
        # Compose accepts strings and numbers; YAML true/false is rejected ("invalid type").
        valid = isinstance(value, str | int | float) and not isinstance(value, bool)
        assert value is None or valid, f"environment {key}={value!r}: quote it"
        if value is not None:
            result[key] = str(value)
    return result


def metrics_port() -> int:
    """The port the compose scorer serves metrics on: its env, else ScorerSettings's default."""
    return int(
        environment(service(SCORER)).get("FRAUD_METRICS_PORT", config_default("metrics_port"))
    )


def host_path(source: str, base: Path = ROOT) -> Path | None:
    """The host path of a bind-mount source, or None for a named volume."""
    if source.startswith((".", "/")):
        return (base / source).resolve()
    return None


def bind_mounts(svc: dict[str, Any]) -> dict[str, Path]:
    """container path → host path of a service's bind mounts (short and long syntax)."""
    mounts: dict[str, Path] = {}
    for volume in svc.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        path = host_path(source)
        if path is not None:
            mounts[target.rstrip("/")] = path
    return mounts


def through_mounts(svc: dict[str, Any], container_path: str) -> Path | None:
    """Where a container path of a service lives on the host, if a bind mount provides it."""
    path = PurePosixPath(container_path)
    for target, source in bind_mounts(svc).items():
        if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
            return source / path.relative_to(target)
    return None


def _uses_our_image(svc: dict[str, Any]) -> bool:
    build = svc.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    return context is not None and (ROOT / context).resolve() == ROOT


def our_services() -> dict[str, dict[str, Any]]:
    """Services that run the image built from this repository's Dockerfile."""
    return {name: svc for name, svc in compose()["services"].items() if _uses_our_image(svc)}
