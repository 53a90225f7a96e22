"""How every command of the project logs: plain text for people, JSON lines for log pipelines.

Every line, whoever logs it (the project, httpx, MLflow, the OTLP exporter) and its exception's
text included, leaves with the credentials of any URL in it masked (`redact_urls`): a tracking
URI, a registry URL or an endpoint given as `https://user:password@host` is logged as
`https://***@host`.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from plumbing.kafka_settings import redact_urls

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}
#: Libraries that log every HTTP request at INFO: the registry client's HTTP library logs a line
#: per schema lookup. Those lines are kept for DEBUG.
CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore")


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return redact_urls(json.dumps(entry, default=str))


class TextFormatter(logging.Formatter):
    """`time level logger: message` (or `fmt`), then the exception's traceback, if any."""

    def __init__(self, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        return redact_urls(super().format(record))


def configure_logging(level: str, log_format: str) -> None:
    """Configure the root logger once, for a command-line entry point."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in CHATTY_LOGGERS:
        chatty = logging.getLogger(name)
        if not any(isinstance(f, InfoAsDebug) for f in chatty.filters):
            chatty.addFilter(InfoAsDebug())


class InfoAsDebug(logging.Filter):
    """Logs a library's INFO lines at DEBUG: shown only when DEBUG is asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)
