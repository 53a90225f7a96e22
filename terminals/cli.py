"""`fraud-features`: the features worker's command line (run it, create its topics).

Faust's own command line (`faust worker`) is not used: the worker takes the project's flags and
environment variables like every other command, and starts faust's `Worker` itself.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from confluent_kafka import KafkaException

from plumbing.command_line import configured
from plumbing.errors import ConfigurationError
from plumbing.health import serve
from plumbing.kafka_settings import redact_urls
from terminals.config import FeaturesSettings
from terminals.health import WorkerHealth
from terminals.metrics import WorkerMetrics
from terminals.router import Router, RouterProgress
from terminals.topics import ensure_topics, prepare_topics

log = logging.getLogger("terminals.cli")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: How long the router may take to finish its batch (outputs acknowledged, offsets committed)
#: once the worker stops.
ROUTER_STOP_S = 10.0
_FAUST_PACKAGES = ("faust", "mode", "aiokafka", "aiohttp", "venusian", "croniter")
MISSING_FAUST = (
    "fraud-features: faust-streaming is not installed ({name}): it is a dependency of "
    "fraud-scorer, so reinstall the package (pip install -e .) or pip install "
    "'faust-streaming>=0.11'"
)


#: What of the librdkafka settings (-X, FRAUD_KAFKA_OPTIONS, FRAUD_KAFKA_CONFIG_FILE) the
#: worker's client applies.
KAFKA_CLIENT_NOTE = (
    "Kafka client settings (-X, FRAUD_KAFKA_OPTIONS, FRAUD_KAFKA_CONFIG_FILE) are in "
    "librdkafka's names; the worker's client is aiokafka: it applies security.protocol "
    "(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), sasl.mechanism (PLAIN, SCRAM-SHA-256, "
    "SCRAM-SHA-512), sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, "
    "ssl.key.location, ssl.key.password, ssl.endpoint.identification.algorithm and "
    "enable.ssl.certificate.verification; another sasl.* or ssl.* key is an error, any other "
    "key is not applied (warned)."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fraud-features",
        description="The features worker (faust-streaming): per-terminal transaction and "
        "confirmed-fraud counts over 1, 7 and 30 days, 7 days behind, in tables with changelogs, "
        "fed by the transactions and labels topics; publishes each terminal's risk to a "
        "compacted topic that the scorer reads whole.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run one replica of the worker",
        description="Run one replica (replicas with the same app id share the work). Every "
        "option can also be set by the environment variable named in its help; a flag wins.",
        epilog=KAFKA_CLIENT_NOTE,
    )
    FeaturesSettings.add_arguments(run)
    topics = commands.add_parser(
        "create-topics",
        help="create the labels topic and the compacted output topics if missing",
        description="Create the worker's labels topic and its compacted (cleanup.policy=compact) "
        "terminal-risk, card-frauds and <terminal-risk>-progress topics (the last with one "
        "partition) where missing; `run` does the same at start. The transactions and "
        "dead-letter topics are the scorer's (fraud-scorer create-topics).",
    )
    topics.add_argument(
        "--partitions", type=int, default=3, help="partitions per topic (default: 3)"
    )
    topics.add_argument(
        "--replication-factor", type=int, default=1, help="replicas per partition (default: 1)"
    )
    FeaturesSettings.add_arguments(topics)
    return parser


def run_worker(config: FeaturesSettings) -> int:
    """Run one replica until SIGTERM or SIGINT; return the exit status."""
    try:
        from faust.worker import Worker

        from terminals.app import build_app
        from terminals.kafka_auth import faust_kafka_auth
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _FAUST_PACKAGES:
            raise
        print(MISSING_FAUST.format(name=exc.name), file=sys.stderr)
        return EXIT_USAGE
    auth = faust_kafka_auth(config.kafka_settings())
    if auth.ignored:
        log.warning("Kafka settings not applied by fraud-features (aiokafka): %s", auth.ignored)
    prepare_topics(config)
    metrics = WorkerMetrics()
    metrics.history_time_scale(config.history_time_scale)
    health = WorkerHealth(max_lag=config.ready_max_lag)
    server = serve(config.metrics_host, config.metrics_port, health, metrics.registry)
    log.info(
        "starting app_id=%s instance=%s bootstrap=%s partitions=%s day_ms=%s kafka=%s",
        config.app_id,
        config.instance_id,
        redact_urls(config.bootstrap_servers),
        config.table_partitions,
        config.day_ms,
        config.redacted_kafka_settings(),
    )
    app = build_app(config, auth, metrics, health)
    progress = RouterProgress(health.router_beat, health.router_delivering, health.router_lag)
    router = Router(config, metrics, progress)
    stop = threading.Event()
    routing = threading.Thread(
        target=_route, args=(router, stop, health), name="router", daemon=True
    )
    worker = Worker(
        app,
        loglevel=config.log_level,
        quiet=True,
        redirect_stdouts=False,
        override_logging=False,
    )
    worker.spinner = None  # a progress spinner writes terminal escapes into the logs
    routing.start()
    status = EXIT_OK
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else EXIT_FAILURE
    finally:
        stop.set()
        routing.join(ROUTER_STOP_S)
        if server is not None:
            server.close()
    return EXIT_FAILURE if router.error is not None else status


def _route(router: Router, stop: threading.Event, health: WorkerHealth) -> None:
    """The router's thread: when it fails for good, the worker stops (and exits with 1)."""
    try:
        router.run(stop)
    except BaseException as exc:
        health.router_failed(str(exc))
        os.kill(os.getpid(), signal.SIGTERM)  # faust stops on it, as on an operator's


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    config = configured("fraud-features", FeaturesSettings, args)
    if config is None:
        return EXIT_USAGE
    try:
        if args.command == "create-topics":
            ensure_topics(config, args.partitions, args.replication_factor)
            return EXIT_OK
        return run_worker(config)
    except ConfigurationError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    except KafkaException as exc:
        log.error("stopping on a Kafka error: %s", exc)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
