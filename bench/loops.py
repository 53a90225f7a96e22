"""Two contenders on confluent-kafka with the service's own librdkafka settings:

- ``passthrough``: consume → produce the same key and value; no decoding, no scoring. The
  ceiling any Python consumer on this broker can reach.
- ``per-record``: the naive loop; each record is decoded, featurised and scored alone (one
  ONNX Runtime call per record), then its decision produced.

Neither does offset bookkeeping beyond what the consumer does by itself. Run as
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

from confluent_kafka import Message

from bench.decide import MAX_BATCH_SIZE, Decider
from contracts.kafka_settings import parse_kafka_options
from stream.startup.config import ServiceConfig
from stream.startup.kafka_clients import ClientErrors, create_consumer, create_producer

#: How long one consume() blocks at most: bounds how late a stop request is noticed.
POLL_TIMEOUT_S = 0.1
#: How long a stopping contender waits for its last outputs to be acknowledged.
FLUSH_TIMEOUT_S = 30.0

Transform = Callable[[Message], tuple[bytes | None, bytes | None]]


def _passthrough() -> Transform:
    return lambda message: (message.key(), message.value())


def _per_record() -> Transform:
    decider = Decider()
    return lambda message: decider.decide([message.value()])[0]


MODES: dict[str, Callable[[], Transform]] = {
    "passthrough": _passthrough,
    "per-record": _per_record,
}


def run(config: ServiceConfig, transform: Transform, stop: threading.Event) -> None:
    """Consume the input topic in batches of the service's cap and produce one output per
    record until `stop` is set."""
    errors = ClientErrors()
    consumer = create_consumer(config, lambda _stats: None, errors)
    producer = create_producer(config, errors)
    consumer.subscribe([config.input_topic])
    try:
        while not stop.is_set():
            for message in consumer.consume(MAX_BATCH_SIZE, POLL_TIMEOUT_S):
                if message.error() is not None:
                    continue
                key, value = transform(message)
                while True:
                    try:
                        producer.produce(config.output_topic, key=key, value=value)
                        break
                    except BufferError:
                        producer.poll(POLL_TIMEOUT_S)
            producer.poll(0)
    finally:
        producer.flush(FLUSH_TIMEOUT_S)
        consumer.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loops", description=__doc__)
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--bootstrap-servers", default=ServiceConfig().bootstrap_servers)
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
    config = ServiceConfig(
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
    run(config, MODES[args.mode](), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
