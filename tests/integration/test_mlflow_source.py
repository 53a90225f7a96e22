"""An MLflow model registry as the model source, against a real MLflow tracking server
(ops/mlflow/mlflow.sh, started by `make test`) and the real broker: `fraud-model publish`
registers packages as versions, a replica follows `models:/<name>@champion`, and `fraud-model
promote models:/<name>/2 --alias champion` swaps its model under load with nothing lost."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from model_tools.cli import main as fraud_model
from tests.integration.conftest import fed_by_loadgen, read_topic
from tests.integration.test_model_swap import loadgen_summary
from tests.support.records import value_of
from tests.unit.test_model_reload import package_copy

TRACKING_URI = os.environ.get("FRAUD_TEST_MLFLOW_TRACKING_URI", "http://127.0.0.1:15000")
# The swap takes the poll, the download, the package check in a child process (1 s here, 4 s
# on a loaded 2-core machine) and the load: the run lasts long enough for all of it.
RATE, DURATION_S, PROMOTE_AT_S = 2_000, 12, 2.0


@pytest.fixture
def tracking(monkeypatch: pytest.MonkeyPatch) -> str:
    """MLflow's client (here and in the replica, which inherits the environment) talks to the
    test server; a registered model of the test's own."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", TRACKING_URI)
    return f"fraud-{uuid.uuid4().hex[:8]}"


def publish(package: Path, name: str, *more: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert fraud_model(["publish", str(package), "--registered-model", name, *more]) == 0
    out = capsys.readouterr().out
    return out.split(" as ")[1].split()[0].rstrip(",")  # models:/<name>/<version>


def test_a_replica_follows_an_mlflow_alias_and_swaps_under_load(
    tracking: str, topics_factory, service_factory, tmp_path: Path, capsys
):
    name = tracking
    v1, v2 = package_copy(tmp_path / "v1", "mlflow-v1"), package_copy(tmp_path / "v2", "mlflow-v2")
    first = publish(v1, name, "--alias", "champion", capsys=capsys)
    second = publish(v2, name, capsys=capsys)  # registered, not served: no alias names it
    assert (first, second) == (f"models:/{name}/1", f"models:/{name}/2")

    topics = topics_factory(partitions=3)
    source = f"models:/{name}@champion"
    service = service_factory(
        topics, "--model-path", source, "--model-poll-s", "0.5", *fed_by_loadgen(RATE)
    )
    service.wait_for_metric("fraud_records_consumed_total", 0)

    def promote_midway() -> None:
        time.sleep(PROMOTE_AT_S)
        assert fraud_model(["promote", second, "--alias", "champion"]) == 0

    promoter = threading.Thread(target=promote_midway)
    promoter.start()
    try:
        summary = loadgen_summary(topics, service.metrics_port, rate=RATE, duration_s=DURATION_S)
    finally:
        promoter.join()  # inside the test's environment, whatever the load run did
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["decided"] == summary["sent"] >= RATE * DURATION_S * 0.9

    versions: dict[int | None, list[str]] = defaultdict(list)
    for message in read_topic(topics.output, summary["sent"]):
        versions[message.partition()].append(json.loads(value_of(message))["model_version"])
    assert {v for seen in versions.values() for v in seen} == {"mlflow-v1", "mlflow-v2"}
    for partition, seen in versions.items():
        assert set(seen[seen.index("mlflow-v2") :]) == {"mlflow-v2"}, f"{partition}: back to v1"
    assert service.metric('fraud_model_reloads_total{result="loaded",role="served"}') == 1
    assert service.metric('fraud_model_reloads_total{result="unavailable",role="served"}') == 0
    assert f"loaded from {source}" in service.log()


def test_publish_and_promote_refuse_what_cannot_serve(tracking: str, tmp_path: Path, capsys):
    name = tracking
    # Not a package: refused before anything is registered.
    assert fraud_model(["publish", str(tmp_path), "--registered-model", name]) == 2
    assert "model.toml" in capsys.readouterr().err
    # A version that does not exist: the registry says so, and the alias stays unset.
    publish(package_copy(tmp_path / "v1", "v1"), name, capsys=capsys)
    assert fraud_model(["promote", f"models:/{name}/7", "--alias", "champion"]) == 2
    assert f"MLflow has no models:/{name}/7" in capsys.readouterr().err
    assert fraud_model(["inspect", str(tmp_path / "v1")]) == 0  # (the package itself is fine)
    capsys.readouterr()
    # A directory promoted by alias, or a version by link: each says which to use.
    assert fraud_model(["promote", f"models:/{name}/1", "--source", str(tmp_path / "l")]) == 2
    assert "--alias" in capsys.readouterr().err
    assert fraud_model(["promote", str(tmp_path / "v1"), "--alias", "champion"]) == 2
    assert "--source" in capsys.readouterr().err


def test_a_registry_that_cannot_be_reached_is_unavailable_not_a_refusal(
    monkeypatch: pytest.MonkeyPatch, capsys
):
    """Exit 3 (try again) with the tracking URI named, after MLflow's own retries (none here)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard: nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert fraud_model(["promote", "models:/fraud/1", "--alias", "champion"]) == 3
    err = capsys.readouterr().err
    assert "could not be read from http://127.0.0.1:9" in err and len(err.splitlines()) == 1


def test_a_version_registered_again_from_another_source_is_downloaded_again(
    tracking: str, tmp_path: Path
):
    """The same name and version number, registered anew (the model deleted and published
    again, as a restored or migrated registry does) from another run: a replica that served
    the first must download the second, never serve the first from its cache."""
    import mlflow

    from scorer.model_package import load_model_package
    from scorer.model_source import MlflowSource, publish_to_mlflow

    name = tracking
    first = package_copy(tmp_path / "first", "cache-first")
    assert publish_to_mlflow(first, name, alias="champion", experiment="fraud-tests") == "1"
    (tmp_path / "cache").mkdir()
    source = MlflowSource(f"models:/{name}@champion", cache=tmp_path / "cache")
    before = source.identity()
    assert load_model_package(source.package_dir(before)).version == "cache-first"

    mlflow.MlflowClient().delete_registered_model(name)
    second = package_copy(tmp_path / "second", "cache-second")
    assert publish_to_mlflow(second, name, alias="champion", experiment="fraud-tests") == "1"
    after = source.identity()
    assert after != before  # version 1 again, from another run
    assert load_model_package(source.package_dir(after)).version == "cache-second"


def test_the_same_version_on_another_tracking_server_is_downloaded_again(
    tracking: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two sources sharing a download cache, on two tracking servers (here the one server
    under two names): a name and version read from one is never served to the other."""
    from scorer.model_package import load_model_package
    from scorer.model_source import MlflowSource, publish_to_mlflow

    name, cache = tracking, tmp_path / "cache"
    cache.mkdir()
    publish_to_mlflow(package_copy(tmp_path / "p", "two-servers"), name, alias=None,
                      experiment="fraud-tests")  # fmt: skip
    here = MlflowSource(f"models:/{name}/1", cache=cache)
    first = here.package_dir(here.identity())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", TRACKING_URI.replace("127.0.0.1", "localhost"))
    there = MlflowSource(f"models:/{name}/1", cache=cache)
    second = there.package_dir(there.identity())
    assert second != first
    assert load_model_package(second).version == "two-servers"


def test_publish_and_a_replica_never_show_the_tracking_uris_password(
    tracking: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """A tracking URI with credentials in it (MLflow sends them as basic auth; the test server
    takes any): nothing `fraud-model` prints, nor MLflow's own lines, nor a replica's reload
    log, carries the password."""
    from prometheus_client import CollectorRegistry

    from plumbing.logs import configure_logging
    from scorer.model_source import DirectorySource, MlflowSource
    from stream.metrics import ServiceMetrics
    from stream.model_reload import ModelReloader, load_serving_model
    from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings

    secret = "s3cret"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", TRACKING_URI.replace("://", f"://alice:{secret}@"))
    name = tracking
    package = package_copy(tmp_path / "v1", "creds-v1")
    assert (
        fraud_model(["publish", str(package), "--registered-model", name, "--alias", "champion"])
        == 0
    )
    out, err = capsys.readouterr()
    assert f"as models:/{name}/1" in out and secret not in out + err

    config = ScorerSettings(model_poll_s=60.0)
    serving = load_serving_model(config, DirectorySource(SHIPPED_MODEL_PATH))
    source = MlflowSource(f"models:/{name}@champion", cache=tmp_path / "cache")
    reloader = ModelReloader(config, ServiceMetrics(CollectorRegistry()), serving, source=source)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("DEBUG", "text")  # MLflow's and urllib3's own lines too
        assert reloader.check_now()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    out, err = capsys.readouterr()
    assert "loaded from models:/" in err and secret not in out + err
