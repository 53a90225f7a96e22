"""`fraud-review`: the analysts' review console (`serve`) and its users (`add-user`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from confluent_kafka import KafkaException

from plumbing.command_line import configured
from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import redact_urls
from review.settings import ReviewSettings

log = logging.getLogger("review.cli")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: The ingest loop polls at least every half second; silence this long means it is stuck.
STALL_AFTER_S = 30.0
MISSING_EXTRA = (
    "fraud-review: {name} is not installed: the console needs the review extra "
    "(pip install 'fraud-scorer[review]')"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fraud-review",
        description="The analysts' review console: every review decision (and decline, with "
        "FRAUD_REVIEW_DECLINES=on) becomes a case, queued by expected loss (score x amount); "
        "every verdict becomes a label on the labels topic, with its reviewer.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the console: read the decisions, serve the page and the JSON API",
        description="Run the console. Every option can also be set by the environment "
        "variable named in its help; a flag wins. Users come from `add-user`.",
    )
    ReviewSettings.add_arguments(serve)
    add_user = commands.add_parser(
        "add-user",
        help="create a user, or set an existing user's password and role",
        description="Create a user of the console in FRAUD_REVIEW_DB, or replace an existing "
        "user's password and role. The password is read from standard input (one line), "
        "never from a flag, which other users could see in the process list.",
    )
    add_user.add_argument(
        "name", help="the user's login name, also each verdict's reviewer (1 to 64 characters)"
    )
    add_user.add_argument(
        "--password-stdin",
        action="store_true",
        required=True,
        help="read the password from standard input (required: the only way to give it)",
    )
    add_user.add_argument(
        "--role",
        choices=("analyst", "lead"),
        default="analyst",
        help="analyst: gives verdicts; lead: may also reverse a verdict given (default: analyst)",
    )
    ReviewSettings.add_arguments(add_user)
    return parser


def add_user(config: ReviewSettings, name: str, role: str, password: str) -> None:
    """Create or update a user. Raises ValueError for a bad name, role or password."""
    from review.auth import MAX_NAME_CHARS, hash_password, role_of
    from review.cases import CaseStore

    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        # The name is each verdict's `reviewer`, which the label contract bounds.
        raise ValueError(f"a user name has 1 to {MAX_NAME_CHARS} printable characters")
    store = CaseStore(config.db)
    try:
        store.add_user(name, hash_password(password), role_of(role))
    finally:
        store.close()


def serve(config: ReviewSettings, stop: threading.Event) -> int:
    """Run the console until `stop` is set or ingestion fails; return the exit status."""
    from review.auth import Authenticator
    from review.cases import CaseStore
    from review.ingest import Ingest
    from review.metrics import ReviewMetrics
    from review.verdicts import LabelPublisher, VerdictDesk
    from review.web import Console, console_server

    store = CaseStore(config.db)
    metrics = ReviewMetrics(config.case_slo_s)
    publisher = LabelPublisher(
        {"bootstrap.servers": config.bootstrap_servers, **config.kafka_settings()},
        config.labels_topic,
    )
    ingest = Ingest(config, store, metrics)

    def alive() -> tuple[bool, str]:
        if not ingest.alive():
            return False, "ingest stopped (see the console's log)"
        silent_s = time.monotonic() - ingest.last_beat
        if silent_s > STALL_AFTER_S:
            return False, f"ingest loop silent for {silent_s:.0f}s"
        return True, "ok"

    def ready() -> tuple[bool, str]:
        ok, why = alive()
        if not ok:
            return ok, why
        if not ingest.assigned.is_set():
            return False, "waiting for the decisions' partitions"
        return True, "ok"

    console = Console(
        store,
        Authenticator(store),
        VerdictDesk(store, publisher, metrics),
        metrics,
        alive,
        ready,
        config.secure_cookies == "on",
        config.forwarded_for == "on",
    )
    try:
        server = console_server(config.host, config.port, console)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve on {config.host}:{config.port}: {exc}; choose another --port"
        ) from exc
    ingest.start()
    server.start()
    log.info(
        "serving on http://%s:%s decisions=%s transactions=%s labels=%s db=%s kafka=%s",
        config.host,
        server.port,
        config.output_topic,
        config.input_topic,
        config.labels_topic,
        redact_urls(config.db),
        config.redacted_kafka_settings(),
    )
    while not stop.wait(1.0) and ingest.alive():
        pass
    status = EXIT_OK if ingest.failure is None else EXIT_FAILURE
    server.close()
    ingest.stop()
    publisher.close()
    store.close()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    config = configured("fraud-review", ReviewSettings, args)
    if config is None:
        return EXIT_USAGE
    try:
        if args.command == "add-user":
            password = sys.stdin.readline().rstrip("\r\n")
            add_user(config, args.name, args.role, password)
            print(
                f"fraud-review: user {args.name!r} ({args.role}) saved in {redact_urls(config.db)}"
            )
            return EXIT_OK
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return serve(config, stop)
    except ImportError as exc:
        if exc.name not in ("argon2", "_argon2_cffi_bindings"):
            raise
        print(MISSING_EXTRA.format(name=exc.name), file=sys.stderr)
        return EXIT_USAGE
    except (ConfigurationError, ValueError) as exc:
        print(f"fraud-review: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KafkaException as exc:
        log.error("stopping on a Kafka error: %s", exc)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
