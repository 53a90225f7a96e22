"""A Schema Registry URL with credentials in it (`http://user:password@registry/...`, which
Confluent's client accepts as basic auth), against the real registry: neither the lines the
registry client logs nor the dead letter of a record it cannot read carry the password."""

from __future__ import annotations

import gc
import logging
import struct
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator

import pytest

from contracts.dead_letter import MESSAGE, STACKTRACE, SourceRecord, dead_letter_headers
from contracts.input_formats import transaction_decoder
from plumbing.errors import RecordError
from plumbing.logs import configure_logging
from tests.integration.test_registry_input import REGISTRY_URL

SECRET = "s3cret"
#: A schema id no registry of the tests holds.
UNKNOWN_ID = 987_654_321


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("restored_logging")
def test_a_registry_url_with_credentials_reaches_no_log_line_and_no_dead_letter(
    capsys: pytest.CaptureFixture[str],
):
    try:
        with urllib.request.urlopen(f"{REGISTRY_URL}/subjects", timeout=5):
            pass
    except OSError as exc:
        pytest.fail(f"no Schema Registry at {REGISTRY_URL} (make registry-up): {exc}")
    parts = urllib.parse.urlsplit(REGISTRY_URL)
    with_credentials = parts._replace(netloc=f"alice:{SECRET}@{parts.netloc}").geturl()
    # DEBUG: the registry client's request lines are logged whatever their level.
    configure_logging("DEBUG", "text")
    decode = transaction_decoder("avro", "redaction-test", {"url": with_credentials})
    with pytest.raises(RecordError) as caught:
        decode(b"\x00" + struct.pack(">I", UNKNOWN_ID) + b"\x02")
    headers = dict(
        dead_letter_headers(
            SourceRecord("redaction-test", 0, 0, 0, None, b"", []),
            caught.value,
            reason=caught.value.reason,
            attempts=1,
            service="g/i",
            failed_at_ms=0,
            with_stacktrace=True,
        )
    )
    assert SECRET.encode() not in headers[MESSAGE] + headers[STACKTRACE]
    with warnings.catch_warnings():  # the client's pooled connection, closed here, not at exit
        warnings.simplefilter("ignore", ResourceWarning)
        del decode, caught  # (the error's frames hold the client too)
        gc.collect()
    err = capsys.readouterr().err
    assert f"/schemas/ids/{UNKNOWN_ID}" in err  # the request was logged, and masked
    assert SECRET not in err
    assert f"http://***@{parts.netloc}" in err
