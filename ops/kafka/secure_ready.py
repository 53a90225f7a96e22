"""Exit 0 once the secured broker lets in the client of a librdkafka properties file.

`make kafka-up-secure` runs this with the virtualenv's Python (it depends on `make venv`), so the
check is the one every client of the service makes: confluent-kafka with the file's settings,
TLS verified against `ssl.ca.location`, then SASL. Ready means the certificate verifies, the
user authenticates and the metadata lists a broker. A refused certificate or password is retried
like any other "not yet" (a broker's SCRAM users come from its metadata log, not from its
configuration, so a refusal need not be final while it starts); the line printed at the timeout
gives the last reason. The plaintext broker's check needs no virtualenv: `kafka_ready.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from ops.kafka.kafka_ready import wait_for_brokers
from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import read_kafka_config_file

#: librdkafka's answers that mean the broker refused the client (its credentials or certificate).
REFUSALS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
#: How long one metadata request may wait before the client's errors are looked at.
_ASK_S = 0.25


class Refused(Exception):
    """The broker answered and said no: to the certificate or to the credentials."""


def brokers_listed(settings: Mapping[str, str], timeout_s: float) -> int:
    """Connect with these librdkafka settings (bootstrap.servers included) and return how many
    brokers the metadata lists.

    Raises:
        Refused: the broker refused the certificate or the credentials (librdkafka's reason).
        TimeoutError: no answer within `timeout_s`.
    """
    errors: list[KafkaError] = []
    # Errors come to error_cb; librdkafka's own log lines would repeat them on stderr.
    config: dict[str, Any] = {**settings, "error_cb": errors.append, "log_level": 0}
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return len(admin.list_topics(timeout=_ASK_S).brokers)
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            refusal = next((e for e in reversed(errors) if e.code() in REFUSALS), None)
            if refusal is not None:
                raise Refused(refusal.str()) from exc
            if time.monotonic() >= deadline:
                raise TimeoutError(errors[-1].str() if errors else str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.kafka.secure_ready",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap", required=True, help="host:port of the secured listener")
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        help="librdkafka properties file with the security settings",
    )
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        settings = read_kafka_config_file(args.config)
    except ConfigurationError as exc:
        print(f"secure_ready: {exc}", file=sys.stderr)
        return 2
    settings["bootstrap.servers"] = args.bootstrap
    try:
        return wait_for_brokers(
            lambda timeout_s: brokers_listed(settings, timeout_s),
            args.bootstrap,
            args.timeout,
            (Refused, TimeoutError),
        )
    except KafkaException as exc:  # a setting librdkafka refuses: no retry mends it
        print(f"secure_ready: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
