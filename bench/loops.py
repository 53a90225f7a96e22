"""Three contenders on confluent-kafka with the service's own librdkafka settings:

- ``passthrough``: consume → produce the same key and value; no decoding, no scoring. The
  ceiling any Python consumer on this broker can reach.
- ``floor``: the least work an at-least-once scorer with card history has to do, in batches
  of the service's cap: each batch decoded, featurised (neutral history: no state read or
  updated) and scored in one ONNX Runtime call, its decisions encoded and produced, plus one
  record of a card state's size per transaction to `<output>-state` (the changelog record),
  every output with a delivery callback (at-least-once must know what was stored). No reasons,
  no offset bookkeeping, no metrics: what the service does beyond this is its own cost.
- ``per-record``: the naive loop; each record is decoded, featurised and scored alone (one
  ONNX Runtime call per record), then its decision produced.

None does offset bookkeeping beyond what the consumer does by itself. Run as
`python -m bench.loops MODE --input-topic … --output-topic … --group-id … [-X KEY=VALUE]` until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import NamedTuple

from confluent_kafka import KafkaError, Message

from bench.decide import MAX_BATCH_SIZE, Decider
from plumbing.kafka_settings import parse_kafka_options
from scorer.card_history_record import STATE_BYTES
from stream.startup.config import ScorerSettings
from stream.startup.kafka_clients import ClientErrors, create_consumer, create_producer

#: How long one consume() blocks at most: bounds how late a stop request is noticed.
POLL_TIMEOUT_S = 0.1
#: How long a stopping contender waits for its last outputs to be acknowledged.
FLUSH_TIMEOUT_S = 30.0

#: A contender's work on one consumed batch: the key and value of each record's output.
Transform = Callable[[list[Message]], Sequence[tuple[bytes | None, bytes | None]]]
#: Where `floor` writes its per-record state, beside its output topic.
STATE_TOPIC_SUFFIX = "-state"


class Mode(NamedTuple):
    """One contender of this module."""

    make_transform: Callable[[], Transform]
    #: A delivery callback on every output, and a card-state-sized record per transaction to
    #: `<output>-state`, as the service writes its changelog.
    writes_state: bool = False


def _passthrough() -> Transform:
    return lambda messages: [(m.key(), m.value()) for m in messages]


def _floor() -> Transform:
    decider = Decider()
    return lambda messages: decider.decide([m.value() for m in messages])


def _per_record() -> Transform:
    decider = Decider()
    return lambda messages: [decider.decide([m.value()])[0] for m in messages]


MODES: dict[str, Mode] = {
    "passthrough": Mode(_passthrough),
    "floor": Mode(_floor, writes_state=True),
    "per-record": Mode(_per_record),
}


def run(config: ScorerSettings, mode: Mode, stop: threading.Event) -> int:
    """Consume the input topic in batches of the service's cap and produce each batch's
    outputs until `stop` is set; return how many outputs were reported not stored (a mode
    without delivery callbacks: 0)."""
    errors = ClientErrors()
    consumer = create_consumer(config, lambda _stats: None, errors)
    producer = create_producer(config, errors)
    consumer.subscribe([config.input_topic])
    transform = mode.make_transform()
    failed = 0

    def delivered(error: KafkaError | None, _message: Message) -> None:
        nonlocal failed
        failed += error is not None

    report = delivered if mode.writes_state else None
    state_topic = config.output_topic + STATE_TOPIC_SUFFIX
    state = bytes(STATE_BYTES)

    def send(topic: str, key: bytes | None, value: bytes | None) -> None:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=report)
                return
            except BufferError:
                producer.poll(POLL_TIMEOUT_S)

    try:
        while not stop.is_set():
            batch = [
                message
                for message in consumer.consume(MAX_BATCH_SIZE, POLL_TIMEOUT_S)
                if message.error() is None
            ]
            for key, value in transform(batch) if batch else ():
                send(config.output_topic, key, value)
                if mode.writes_state:
                    send(state_topic, key, state)
            producer.poll(0)
    finally:
        producer.flush(FLUSH_TIMEOUT_S)
        consumer.close()
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loops", description=__doc__)
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--bootstrap-servers", default=ScorerSettings().bootstrap_servers)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--group-id", required=True)
    parser.add_argument(
        "-X",
        "--kafka-option",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka setting, as the service's -X",
    )
    args = parser.parse_args(argv)
    config = ScorerSettings(
        bootstrap_servers=args.bootstrap_servers,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        group_id=args.group_id,
        metrics_port=0,
        kafka_options=parse_kafka_options(args.kafka_options),
    )
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    failed = run(config, MODES[args.mode], stop)
    if failed:
        print(f"bench.loops {args.mode}: {failed} outputs were not stored", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
