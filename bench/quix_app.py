"""The Quix Streams contender: the maintained Python stream-processing library a team would pick
today, written as its documentation shows, doing the service's job with per-card state in Quix's
own `State` (RocksDB, backed by its changelog topic) and the same scoring work (bench/decide.py).

The application, record by record:

    transactions (bytes) ──► sdf.apply(decide, stateful=True) ──► sdf.to_topic(decisions)

`decide` decodes the transaction with the service's decoder, reads its card's state from the
`State` of the record's key (the card id), applies the service's card-history update to it
(bench/keyed_history.py: the same windows and features as the service's), stores the state back
and scores the one record with the same ONNX model and decision path. The model is called once
per record: a StreamingDataFrame hands its functions one record at a time and has no batching
step (its batching sinks batch writes to external stores, not processing), so a Quix user has
no micro-batch to score.

Settings, each Quix's best for this job:
- at-least-once (Quix's default, as the pipeline contender's);
- `commit_interval` 5 s (Quix's default): a checkpoint flushes the producer, writes RocksDB and
  commits; fewer checkpoints only lengthen what a crash repeats;
- the service's own librdkafka consumer settings (short fetch waits, bounded pre-fetch, the
  10 ms queue back-off whose 1 s default starves a fast consumer), except what Quix sets itself
  (offset store and commits, offset reset, assignment strategy, statistics);
- the service's producer settings (idempotent, acks=all) with librdkafka's `linger.ms` default
  (5 ms, which Quix keeps): it produces one record at a time, so waiting batches more;
- state values as raw bytes (`State.get_bytes`/`set_bytes`), not Quix's default JSON.

It runs in its own virtualenv (.venv-quix, bench/quix-requirements.txt): quixstreams pins
confluent-kafka below 2.13, the project needs 2.16. Run as `python -m bench.quix_app
--input-topic … --output-topic … --group-id … --state-dir … [--history-time-scale S]
[-X KEY=VALUE]` until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from quixstreams import Application, State, message_context

from bench.decide import Decider
from bench.keyed_history import KeyedHistory
from contracts.transaction import decode_transaction
from plumbing.kafka_settings import parse_kafka_options
from scorer.columns import TransactionColumns
from stream.startup.kafka_clients import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS

#: Quix's default checkpoint interval, given explicitly.
COMMIT_INTERVAL_S = 5.0
#: Consumer settings that Quix owns: it stores and commits offsets at its checkpoints, resets
#: by `auto_offset_reset`, assigns with its own strategy and keeps its own statistics.
QUIX_OWNED = frozenset(
    {
        "enable.auto.offset.store",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "partition.assignment.strategy",
        "statistics.interval.ms",
    }
)
CONSUMER_CONFIG: dict[str, Any] = {
    key: value for key, value in CONSUMER_DEFAULTS.items() if key not in QUIX_OWNED
}
PRODUCER_CONFIG: dict[str, Any] = {
    key: value for key, value in PRODUCER_DEFAULTS.items() if key != "linger.ms"
}
#: The key, in a card's `State`, of its history.
CARD_STATE = "card"


class StatefulScorer:
    """The stateful function of the StreamingDataFrame: one transaction in, its decision out,
    its card's state updated in the key's `State`."""

    def __init__(self, *, time_scale: float) -> None:
        self._decider = Decider()
        self._history = KeyedHistory(time_scale=time_scale)

    def __call__(self, value: bytes, state: State[str, bytes]) -> bytes:
        transaction = decode_transaction(value)
        columns = TransactionColumns.from_transactions([transaction])
        row, changed = self._history.update(
            state.get_bytes(CARD_STATE), columns, message_context().offset
        )
        if changed is not None:
            state.set_bytes(CARD_STATE, changed)
        ((_key, decision),) = self._decider.decide_transactions(
            [transaction], history=row, columns=columns
        )
        return decision


def build_app(args: argparse.Namespace) -> Application:
    """The application with its one StreamingDataFrame."""
    extra = parse_kafka_options(args.kafka_options)
    app = Application(
        broker_address=args.bootstrap_servers,
        consumer_group=args.group_id,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        commit_interval=COMMIT_INTERVAL_S,
        state_dir=args.state_dir,
        consumer_extra_config={**CONSUMER_CONFIG, **extra},
        producer_extra_config={**PRODUCER_CONFIG, **extra},
        loglevel="WARNING",
    )
    transactions = app.topic(args.input_topic, key_deserializer="bytes", value_deserializer="bytes")
    decisions = app.topic(args.output_topic, key_serializer="bytes", value_serializer="bytes")
    sdf = app.dataframe(transactions)
    sdf = sdf.apply(StatefulScorer(time_scale=args.history_time_scale), stateful=True)
    sdf.to_topic(decisions)  # keyed by the input's key, the card id
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quix_app", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--group-id", required=True)
    parser.add_argument("--state-dir", required=True, help="Quix's RocksDB state directory")
    parser.add_argument(
        "--history-time-scale",
        type=float,
        default=1.0,
        help="how compressed the input's event time is, as the service's (default: %(default)s)",
    )
    parser.add_argument(
        "-X",
        "--kafka-option",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka setting of its consumer and producer, as the service's -X",
    )
    build_app(parser.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
