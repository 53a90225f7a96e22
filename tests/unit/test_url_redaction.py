"""No log line and no error carries a URL's user:password (plumbing/kafka_settings.py
`redact_urls`): the function itself, then each place a URL reaches a log line, an error or a
dead letter."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbing.errors import ModelSourceUnavailableError, SchemaDecodeError
from plumbing.kafka_settings import redact_urls
from plumbing.logs import configure_logging
from tests.support.budget import MIB, Budget, within

SECRET = "s3cret"
#: A tracking server address with credentials, where nothing listens (port 9: discard).
UNREACHABLE = f"http://alice:{SECRET}@127.0.0.1:9"


@pytest.fixture
def formatted_logs() -> Iterator[None]:
    """Each test configures the root logger as an entry point does (`configure_logging`, its
    lines on the captured stderr); restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


# --- the function -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://alice:s3cret@host:5000/api", "http://***@host:5000/api"),
        ("https://alice@host/x", "https://***@host/x"),  # a user name alone is userinfo too
        ("https://al%40ice:p%3Ass@host", "https://***@host"),  # percent-encoded
        ("https://alice:p@ss@host/a@b", "https://***@host/a@b"),  # an unencoded @ in it
        ("http://alice:s3cret@[::1]:15000/x", "http://***@[::1]:15000/x"),  # IPv6 host
        ("http://[fe80::1%25eth0]:80/a@b", "http://[fe80::1%25eth0]:80/a@b"),  # none there
        ("SASL_SSL://bob:pw@broker:9093", "SASL_SSL://***@broker:9093"),
        ("bob:pw@broker-1:9092,broker-2:9092", "***@broker-1:9092,broker-2:9092"),  # no scheme
        ("servers=bob:pw@[::1]:9092", "servers=***@[::1]:9092"),
        ("from 'http://u:p@h/x' and http://v:q@k", "from 'http://***@h/x' and http://***@k"),
        ('{"message": "GET http://u:p@h/x"}', '{"message": "GET http://***@h/x"}'),
        ("http://h/x?token=abc&b=1", "http://h/x?token=***&b=1"),  # a token in the query
        ("http://h/x?access_token=abc", "http://h/x?access_token=***"),
        # Left as they are: no credentials in them.
        ("models:/fraud@champion", "models:/fraud@champion"),
        ("mail alice@example.com at 12:30", "mail alice@example.com at 12:30"),
        ("http://host:5000/path", "http://host:5000/path"),
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("", ""),
    ],
)
def test_redact_urls_masks_the_userinfo_of_every_url(text: str, expected: str):
    from plumbing.kafka_settings import redact_urls

    assert redact_urls(text) == expected


def test_redacted_settings_mask_credentials_in_the_url_of_a_safe_key():
    from plumbing.kafka_settings import redact

    shown = redact(
        {
            "sasl.oauthbearer.token.endpoint.url": f"https://client:{SECRET}@idp/token",
            "sasl.password": SECRET,
            "client.id": "scorer",
        }
    )
    assert shown == {
        "sasl.oauthbearer.token.endpoint.url": "https://***@idp/token",
        "sasl.password": "***",
        "client.id": "scorer",
    }


# --- every log line -----------------------------------------------------------------------------


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.usefixtures("formatted_logs")
def test_no_log_line_carries_a_password_whoever_logs_it(
    log_format: str, capsys: pytest.CaptureFixture[str]
):
    """The entry points' handler masks what any library logs (httpx's request lines, MLflow's,
    the OTLP exporter's), its exceptions' text included (at DEBUG, where httpx's show)."""
    configure_logging("DEBUG", log_format)
    logging.getLogger("httpx2").info("HTTP Request: GET %s/schemas/ids/1", UNREACHABLE)
    try:
        raise OSError(f"cannot reach {UNREACHABLE}")
    except OSError:
        logging.getLogger("opentelemetry.exporter").exception("export to %s failed", UNREACHABLE)
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.count("http://***@127.0.0.1:9") == 3


# --- each place ---------------------------------------------------------------------------------


def test_an_mlflow_source_that_cannot_be_read_names_its_server_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
):
    pytest.importorskip("mlflow")
    from scorer.model_source import MlflowSource

    monkeypatch.setenv("MLFLOW_TRACKING_URI", UNREACHABLE)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(ModelSourceUnavailableError) as caught:
        MlflowSource("models:/fraud@champion").identity()
    message = str(caught.value)
    assert SECRET not in message
    assert "could not be read from http://***@127.0.0.1:9" in message


@pytest.mark.usefixtures("formatted_logs")
def test_the_reloader_logs_an_unreadable_mlflow_source_without_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    pytest.importorskip("mlflow")
    from prometheus_client import CollectorRegistry

    from scorer.model_source import DirectorySource, MlflowSource
    from stream.metrics import ServiceMetrics
    from stream.model_reload import ModelReloader, load_serving_model
    from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings

    config = ScorerSettings(model_poll_s=60.0)
    serving = load_serving_model(config, DirectorySource(SHIPPED_MODEL_PATH))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", UNREACHABLE)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    source = MlflowSource("models:/fraud@champion", cache=tmp_path)
    reloader = ModelReloader(config, ServiceMetrics(CollectorRegistry()), serving, source=source)
    configure_logging("INFO", "text")
    assert not reloader.check_now()
    err = capsys.readouterr().err
    assert "model source unavailable" in err and "127.0.0.1:9" in err
    assert SECRET not in err


def test_fraud_model_says_an_unreachable_registry_without_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    pytest.importorskip("mlflow")
    from model_tools.cli import main as fraud_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", UNREACHABLE)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert fraud_model(["promote", "models:/fraud/1", "--alias", "champion"]) == 3
    err = capsys.readouterr().err
    assert "http://***@127.0.0.1:9" in err and SECRET not in err


@pytest.mark.usefixtures("formatted_logs")
def test_the_scorers_start_line_shows_the_bootstrap_servers_without_a_password(
    capsys: pytest.CaptureFixture[str],
):
    from stream.startup import cli
    from stream.startup.config import ScorerSettings

    class Stop(Exception):
        pass

    def stop(_location: str) -> None:
        raise Stop

    config = ScorerSettings(bootstrap_servers=f"SASL_SSL://bob:{SECRET}@broker:9093")
    configure_logging("INFO", "text")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "open_model_source", stop)  # nothing past the start line
        with pytest.raises(Stop):
            cli.run_service(config, cli.StopRequest())
    err = capsys.readouterr().err
    assert "bootstrap=SASL_SSL://***@broker:9093" in err and SECRET not in err


def test_a_dead_letter_never_carries_a_password_from_its_error():
    from contracts.dead_letter import MESSAGE, STACKTRACE, SourceRecord, dead_letter_headers

    try:
        raise SchemaDecodeError(f"schema registry refused the lookup at {UNREACHABLE}/x")
    except SchemaDecodeError as exc:
        error = exc
    record = SourceRecord("t", 0, 1, 0, b"k", b"v", [])
    headers = dict(
        dead_letter_headers(
            record,
            error,
            reason=error.reason,
            attempts=1,
            service="g/i",
            failed_at_ms=0,
            with_stacktrace=True,
        )
    )
    assert SECRET.encode() not in headers[MESSAGE] + headers[STACKTRACE]
    assert b"http://***@127.0.0.1:9/x" in headers[MESSAGE]


#: Texts a hostile writer can put in an error or a log line (a rules expression quoted in its
#: refusal): each place a credential may start is tried, so an unbounded pattern was quadratic.
HOSTILE_TEXTS = {
    "equals-colon": "=a:" * 21_000 + "@",
    "schemes": "http://" * 9_000 + "@",
    "one-user": "a" * 64_000 + ":@",
    "many-at": "u:p@" * 16_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_redaction_is_linear_in_a_hostile_text(name: str) -> None:
    # Issue 43 review: "=a:" * 16,000 (48 KB) took 2.8-4.4 s; a refused rules update went
    # through three such passes on the rules reader's thread.
    text = HOSTILE_TEXTS[name]
    with within(Budget(peak_bytes=4 * MIB, seconds=1.0), f"{name}, {len(text):,} characters"):
        redact_urls(text)


def test_a_dead_letter_reads_only_what_it_keeps_of_a_huge_error() -> None:
    from contracts.dead_letter import MESSAGE, SourceRecord, dead_letter_headers

    error = SchemaDecodeError(f"{UNREACHABLE} " + "=a:" * 300_000)
    record = SourceRecord("t", 0, 1, 0, b"k", b"v", [])
    with within(Budget(peak_bytes=8 * MIB, seconds=1.0), "a dead letter of a 900 KB error"):
        headers = dict(
            dead_letter_headers(record, error, reason="x", attempts=1, service="s", failed_at_ms=0)
        )
    assert headers[MESSAGE].startswith(b"http://***@127.0.0.1:9 =a:")
    assert headers[MESSAGE].endswith("… [truncated]".encode())


def test_a_credential_cut_by_the_bound_of_a_header_is_still_masked() -> None:
    from plumbing.kafka_settings import redacted_prefix

    text = "x" * 995 + f" {UNREACHABLE}/path"
    assert SECRET not in redacted_prefix(text, 1_000)


def test_loadgen_names_an_unreadable_metrics_url_without_the_password():
    from loadgen.cli import _scorer_scale

    scale, why = _scorer_scale(f"http://alice:{SECRET}@127.0.0.1:9/metrics")
    assert scale is None and "http://***@127.0.0.1:9/metrics" in why and SECRET not in why


def test_a_refused_setting_is_shown_without_a_password():
    from plumbing.errors import ConfigurationError
    from stream.startup.config import ScorerSettings

    with pytest.raises(ConfigurationError) as caught:
        ScorerSettings.from_sources({}, {"FRAUD_METRICS_PORT": f"http://bob:{SECRET}@host:9100"})
    message = str(caught.value)
    assert "FRAUD_METRICS_PORT" in message and "http://***@host:9100" in message
    assert SECRET not in message
