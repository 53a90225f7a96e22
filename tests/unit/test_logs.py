"""plumbing/logs.py: what every command's log shows."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from plumbing.logs import CHATTY_LOGGERS, configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restored_logging")
def test_a_registry_lookup_is_not_an_info_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 43: every schema lookup logged "httpx2: HTTP Request: GET ..." at INFO.
    configure_logging("INFO", "text")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).info("HTTP Request: GET http://registry/schemas/ids/7")
        logging.getLogger(name).warning("the registry answered slowly")
    logging.getLogger("stream.service").info("consuming")
    err = capsys.readouterr().err
    assert "HTTP Request" not in err
    assert err.count("the registry answered slowly") == len(CHATTY_LOGGERS)
    assert "consuming" in err


@pytest.mark.usefixtures("restored_logging")
def test_a_registry_lookup_shows_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("DEBUG", "text")
    configure_logging("DEBUG", "text")  # configured twice: still one line per request
    logging.getLogger("httpx2").info("HTTP Request: GET http://registry/schemas/ids/7")
    lines = [line for line in capsys.readouterr().err.splitlines() if "HTTP Request" in line]
    assert len(lines) == 1 and " DEBUG httpx2: " in lines[0]
