"""Where the model packages a replica serves come from (`FRAUD_MODEL_PATH`, `FRAUD_SHADOW_MODEL`).

Two kinds, told apart by the location's form:

- a directory, or a symbolic link to one (`DirectorySource`): `fraud-model promote DIR --source
  LINK` repoints the link in one atomic rename;
- an MLflow registered model, `models:/<name>@<alias>` or `models:/<name>/<version>`
  (`MlflowSource`), read from the tracking server at `MLFLOW_TRACKING_URI` with MLflow's own
  client and its own credentials (`MLFLOW_TRACKING_TOKEN`, or `MLFLOW_TRACKING_USERNAME` and
  `MLFLOW_TRACKING_PASSWORD`). It needs the `mlflow` extra. `fraud-model publish` registers a
  package as a version; `fraud-model promote models:/<name>/<version> --alias champion` moves
  the alias every replica follows.

A source answers two questions: what it names now (`identity`, cheap enough to ask every poll),
and where that package lies on this machine (`package_dir`, which downloads it if it must).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Protocol

from plumbing.errors import ConfigurationError, ModelSourceUnavailableError
from plumbing.kafka_settings import redact_urls
from scorer.model_package import MANIFEST_FILE, ONNX_FILE, load_model_package

MLFLOW_PREFIX = "models:/"
_MLFLOW_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))")
#: Where in its run's artifacts a published package lies.
PACKAGE_ARTIFACT = "package"
#: Hex digits of the digest that names where a downloaded version came from.
_ORIGIN_DIGITS = 16
#: The install that brings the MLflow client (mlflow-skinny, without the server).
MLFLOW_EXTRA = "pip install 'fraud-scorer[mlflow]'"


class ModelSource(Protocol):
    """A place the served package is read from, and read again when it changes."""

    def identity(self) -> Hashable:
        """What the source names now; a different value is a new package to load.
        ModelSourceUnavailableError when the source cannot be asked now, ConfigurationError
        when it names nothing (an alias set on no version)."""
        ...

    def package_dir(self, identity: Hashable) -> Path:
        """The local directory of the package `identity` names (model.toml, model.onnx)."""
        ...


def is_mlflow_uri(location: str) -> bool:
    return location.startswith(MLFLOW_PREFIX)


def open_model_source(location: str) -> ModelSource:
    """The source `location` names: an MLflow `models:/` URI, else a directory path."""
    if is_mlflow_uri(location):
        return MlflowSource(location)
    return DirectorySource(Path(location))


def check_model_location(location: str, setting: str) -> None:
    """ValueError (one line: what to fix) unless `location` can name a model source: a package
    directory, or a well-formed `models:/` URI with the MLflow client installed."""
    if is_mlflow_uri(location):
        parse_mlflow_uri(location)
        try:
            _mlflow_client_module()
        except ConfigurationError as exc:
            raise ValueError(f"{setting}: {exc}") from None
        return
    if not Path(location).is_dir():
        raise ValueError(
            f"{setting} {location!r} is not a model package directory (model.onnx + model.toml, "
            f"docs/models.md) nor an MLflow model ({MLFLOW_PREFIX}<name>@<alias>)"
        )


class DirectorySource:
    """A package directory, or a link to one: its identity is where the link points and the
    two files' modification times and sizes, so a rewritten file is a new package too. A
    directory that is gone, or whose two files cannot be read (a volume not mounted, a link to
    nothing, a package half copied), cannot be read now: ModelSourceUnavailableError, and it is
    read again at the next poll."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def identity(self) -> tuple[str, tuple[int, int], tuple[int, int]]:
        directory = Path(os.path.realpath(self.path))
        manifest, onnx = _stamp(directory / MANIFEST_FILE), _stamp(directory / ONNX_FILE)
        if manifest is None or onnx is None:
            raise ModelSourceUnavailableError(
                f"model source {str(self.path)!r}: {str(directory)!r} holds no readable "
                f"{MANIFEST_FILE} and {ONNX_FILE} (a directory gone or unreadable, a package "
                "not copied whole yet)"
            )
        return (str(directory), manifest, onnx)

    def package_dir(self, identity: Hashable) -> Path:
        assert isinstance(identity, tuple)
        return Path(identity[0])  # the directory the link named when asked, not a later one

    def __str__(self) -> str:
        return str(self.path)


def _stamp(path: Path) -> tuple[int, int] | None:
    """(modification time, size) of a readable file; None when it cannot be read."""
    try:
        status = path.stat()
    except OSError:
        return None
    if not os.access(path, os.R_OK):
        return None
    return (status.st_mtime_ns, status.st_size)


def parse_mlflow_uri(uri: str) -> tuple[str, str | None, str | None]:
    """(name, alias, version) of `models:/<name>@<alias>` or `models:/<name>/<version>`."""
    match = _MLFLOW_URI.fullmatch(uri)
    if match is None:
        raise ValueError(
            f"MLflow model {uri!r} is not models:/<name>@<alias> nor models:/<name>/<version>"
        )
    return match["name"], match["alias"], match["version"]


class MlflowSource:
    """A registered model of an MLflow model registry, followed by alias (or pinned to one
    version). Each version a replica serves is downloaded once into a folder of its own; the one
    before stays, the older ones are removed.

    A version is known by where it came from, not by its number alone: its folder is named by
    the tracking server, the name, the number, the version's `source` and its run, so a version
    registered again from another run (a registry restored or migrated, a model deleted and
    published anew) or the same name and number on another tracking server is downloaded
    again, never served from the cache."""

    def __init__(self, uri: str, cache: Path | None = None) -> None:
        try:
            self.name, self.alias, self.version = parse_mlflow_uri(uri)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.uri = uri
        mlflow = _mlflow_client_module()
        #: Resolved once (MLFLOW_TRACKING_URI): the client, the downloads and the cache agree.
        self._tracking_uri = str(mlflow.get_tracking_uri())
        self._client = mlflow.MlflowClient(tracking_uri=self._tracking_uri)
        self._cache = cache or Path(tempfile.mkdtemp(prefix="fraud-models-"))
        self._cache.mkdir(parents=True, exist_ok=True)
        self._kept: list[Path] = []

    def identity(self) -> tuple[str, str, str, str]:
        """(name, version, where its files are, its run): a version re-registered elsewhere
        is new."""
        try:
            if self.alias is not None:
                found = self._client.get_model_version_by_alias(self.name, self.alias)
            else:
                found = self._client.get_model_version(self.name, self.version)
        except Exception as exc:  # MLflow raises MlflowException, requests' errors and more
            if getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                raise ConfigurationError(
                    f"MLflow has no {self.uri}: publish a package (fraud-model publish) and "
                    "point the alias at it (--alias, or fraud-model promote)"
                ) from None
            raise _unavailable(self.uri, exc) from exc
        return (self.name, str(found.version), str(found.source), str(found.run_id or ""))

    def package_dir(self, identity: Hashable) -> Path:
        assert isinstance(identity, tuple)
        name, version = identity[0], identity[1]
        origin = hashlib.sha256(
            "\n".join([self._tracking_uri, *map(str, identity)]).encode()
        ).hexdigest()[:_ORIGIN_DIGITS]
        target = self._cache / f"{name}-v{version}-{origin}"
        if not (target / MANIFEST_FILE).is_file():
            target = self._download(identity, target)
        if target not in self._kept:
            self._kept.append(target)
            for old in self._kept[:-2]:  # the one in service and the one replacing it stay
                shutil.rmtree(old, ignore_errors=True)
            del self._kept[:-2]
        return target

    def _download(self, identity: tuple[Any, ...], target: Path) -> Path:
        name, version = identity[0], identity[1]
        where = f"{MLFLOW_PREFIX}{name}/{version}"
        artifacts = _mlflow_client_module().artifacts
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=self._cache))
        try:
            found = Path(
                artifacts.download_artifacts(
                    artifact_uri=where, dst_path=str(staging), tracking_uri=self._tracking_uri
                )
            )
            # Registered anew while it downloaded: these files may be the other version's.
            now = self._client.get_model_version(name, version)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise _unavailable(where, exc) from exc
        if (str(now.source), str(now.run_id or "")) != tuple(identity[2:]):
            shutil.rmtree(staging, ignore_errors=True)
            raise ModelSourceUnavailableError(
                f"MLflow model {where} was registered again while it downloaded: asked again "
                "at the next poll"
            )
        if not (found / MANIFEST_FILE).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            raise ConfigurationError(
                f"MLflow model {where} holds no {MANIFEST_FILE}: "
                "register a model package (fraud-model publish DIR --registered-model NAME)"
            )
        os.replace(found, target)  # whole or not at all: a half download is never served
        shutil.rmtree(staging, ignore_errors=True)
        return target

    def __str__(self) -> str:
        return self.uri


def publish_to_mlflow(package: Path, name: str, *, alias: str | None, experiment: str) -> str:
    """Log `package` (checked first) as the artifacts of a run of `experiment` and register it
    as a new version of the registered model `name` (made if new), tagged with the package's
    own name and version; move `alias` to it if given. Returns the version number."""
    loaded = load_model_package(package)
    mlflow = _mlflow_client_module()
    client = mlflow.MlflowClient()
    try:
        found = client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(experiment)
        )
        run = client.create_run(
            experiment_id,
            tags={"fraud.package": loaded.manifest.model.name, "fraud.version": loaded.version},
        )
        client.log_artifacts(run.info.run_id, str(package), artifact_path=PACKAGE_ARTIFACT)
        # MLflow prints the run's link on stdout, the tracking URI's credentials with it.
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            client.set_terminated(run.info.run_id)
        sys.stdout.write(redact_urls(printed.getvalue()))
        if not client.search_registered_models(filter_string=f"name = '{name}'"):
            client.create_registered_model(name)
        version = client.create_model_version(
            name,
            f"{run.info.artifact_uri}/{PACKAGE_ARTIFACT}",
            run.info.run_id,
            tags={
                "fraud.version": loaded.version,
                "fraud.onnx_sha256": loaded.manifest.onnx_sha256,
            },
        )
        if alias is not None:
            client.set_registered_model_alias(name, alias, version.version)
    except Exception as exc:
        raise _unavailable(f"{MLFLOW_PREFIX}{name}", exc) from exc
    return str(version.version)


def move_mlflow_alias(uri: str, alias: str) -> str | None:
    """Point `alias` of the registered model at the version `uri` (models:/<name>/<version>)
    names; returns the version it named before (None: it named none)."""
    name, _, version = parse_mlflow_uri(uri)
    if version is None:
        raise ConfigurationError(f"promote a version (models:/{name}/<version>), not {uri}")
    client = _mlflow_client_module().MlflowClient()
    try:
        try:
            before: str | None = str(client.get_model_version_by_alias(name, alias).version)
        except Exception:  # MLflow says "alias not found" with an exception like any other
            before = None
        client.set_registered_model_alias(name, alias, version)
    except Exception as exc:
        raise _unavailable(uri, exc) from exc
    return before


def _unavailable(uri: str, exc: Exception) -> ModelSourceUnavailableError:
    """The error of a registry that cannot be read: it names the tracking server, never the
    credentials its URI may hold (MLflow quotes the whole URI in its own errors too)."""
    detail = redact_urls(" ".join(str(exc).split()))[:300]
    tracking = redact_urls(
        os.environ.get("MLFLOW_TRACKING_URI", "(MLFLOW_TRACKING_URI is not set)")
    )
    return ModelSourceUnavailableError(
        f"MLflow model {uri} could not be read from {tracking}: {type(exc).__name__}: {detail}"
    )


def _mlflow_client_module() -> Any:
    """The `mlflow` module (its client), or ConfigurationError saying how to install it."""
    # MLflow's loggers then log through the command's handler, which masks URL credentials,
    # instead of a stderr handler of their own.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    try:
        import mlflow  # the mlflow extra; imported only where a models:/ source is used
    except ImportError:
        raise ConfigurationError(
            f"an MLflow model source ({MLFLOW_PREFIX}...) needs the MLflow client: {MLFLOW_EXTRA}"
        ) from None
    return mlflow
