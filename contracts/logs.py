"""How every command of the project logs: plain text for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time

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
        return json.dumps(entry, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """Configure the root logger once, for a command-line entry point."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLinesFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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
