"""What carrying trace context costs a batch's decisions on their way to the producer.

    python -m bench.trace_context [--batch 256] [--batches 200] [--rounds 5]

Times, per batch, what the scoring stage does between its decisions being encoded and their being
handed to librdkafka (`BatchOutputs.send_decisions` in stream/batch_outputs.py, and the batch span
when it is on): reading each record's trace headers, then `KafkaSink.send_batch` to a topic on the
local broker. The records are consumed from the broker, so `Message.headers()` converts librdkafka's
headers as it does in the service. Four cases, interleaved within every round:

- `before`: the path without trace context (headers never read, none produced);
- `absent`: records without headers, the common case: the cost of looking;
- `present`: every record carries a traceparent and a tracestate, copied to its decision;
- `present+otel`: the same, plus one span per batch with a link per record, ended into the
  SDK's batch processor, whose exporter encodes the spans as OTLP/HTTP would (protobuf) and
  drops them instead of sending: the network is the collector's cost, not the replica's.

The cases take turns batch by batch, in a rotating order, so that they share a busy machine's
drift; delivery (flush) is outside the timing. Prints one JSON line: the median µs per batch of
each case over `--rounds` times `--batches` batches (after one round of warm-up), and its ratio
to `before`. Needs the otel extra for the last case (skipped without it). Run by hand; its
topics are deleted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from confluent_kafka import Consumer, Message, Producer

from bench.harness import Broker, connect, tool_parser
from contracts.offsets import OffsetTracker, position_of
from contracts.trace_context import batch_trace_headers
from stream.outcomes import OutcomeGroup, OutputLabel
from stream.sink import Headers, KafkaSink, Output
from stream.tracing import BatchOutcome, BatchTracer

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
#: One case: a batch's decisions sent through the sink to the topic, completing the group.
Case = Callable[[KafkaSink, str, OutcomeGroup], None]
#: A decision's size in JSON, near enough.
VALUE = b'{"transaction_id":"t-000000","card_id":"c-000000","score":0.0123,"decision":"approve"}'


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def consumed(broker: Broker, count: int, headers: Headers | None) -> list[Message]:
    """`count` records produced with `headers` and consumed back, as the service holds them."""
    topic = broker.topic(f"trace-input-{'with' if headers else 'without'}", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, VALUE, f"c-{i}".encode(), headers=cast(Any, headers))
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"bench-trace-{broker.run_id}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + 60
    while len(messages) < count and time.monotonic() < deadline:
        messages.extend(m for m in consumer.consume(count, 0.5) if m.error() is None)
    consumer.close()
    if len(messages) < count:
        raise RuntimeError(f"read {len(messages)} of {count} records back from {topic}")
    return messages[:count]


def otel_tracer(max_batch_size: int) -> BatchTracer | None:
    """The service's tracer over a batch processor whose exporter encodes and drops; None
    without the otel extra."""
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        return None

    from stream.tracing import OtelBatchTracer

    class EncodingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    return OtelBatchTracer.create(
        BatchSpanProcessor(EncodingExporter()),
        input_topic="transactions",
        group_id="bench",
        instance_id="bench",
        max_batch_size=max_batch_size,
        environ={},
    )


def send_decisions(
    sink: KafkaSink,
    topic: str,
    messages: list[Message],
    keys: list[bytes],
    values: list[bytes],
    group: OutcomeGroup,
    tracer: BatchTracer | None,
    *,
    read_trace: bool,
) -> None:
    """What `BatchOutputs` does from encoded decisions (`keys`, `values`) to librdkafka, for
    one batch."""
    started = time.perf_counter()
    contexts = batch_trace_headers(messages) if read_trace else None

    def output_of(i: int) -> Output:
        raise AssertionError(f"decision {i} refused at once: is the broker healthy?")

    sink.send_batch(topic, keys, values, group, output_of, headers=contexts)
    if tracer is not None:
        outcome = BatchOutcome(len(messages), len(messages), 0, "bench")
        tracer.batch_scored(contexts, time.perf_counter() - started, outcome)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("python -m bench.trace_context", __doc__)
    parser.add_argument("--batch", type=_positive, default=256, help="records per batch")
    parser.add_argument("--batches", type=_positive, default=200, help="batches per round")
    parser.add_argument("--rounds", type=_positive, default=5, help="rounds measured")
    args = parser.parse_args(argv)
    broker = connect("bench.trace_context", args.bootstrap_servers)
    if broker is None:
        return 2
    try:
        figures = measure(broker, args.batch, args.batches, args.rounds)
    finally:
        broker.delete_topics()
    print(json.dumps(figures))
    return 0


def measure(broker: Broker, batch: int, batches: int, rounds: int) -> dict[str, Any]:
    without = consumed(broker, batch, None)
    with_trace = consumed(broker, batch, [("traceparent", PARENT), ("tracestate", STATE)])
    tracer = otel_tracer(batch)
    keys = [f"c-{i}".encode() for i in range(batch)]
    values = [VALUE] * batch

    def case(messages: list[Message], tracer: BatchTracer | None, read_trace: bool) -> Case:
        return lambda sink, topic, group: send_decisions(
            sink, topic, messages, keys, values, group, tracer, read_trace=read_trace
        )

    cases = {
        "before": case(without, None, False),
        "absent": case(without, None, True),
        "present": case(with_trace, None, True),
    }
    if tracer is not None:
        cases["present+otel"] = case(with_trace, tracer, True)
    topic = broker.topic("trace-decisions", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    sink = KafkaSink(producer, lambda output, error: None)
    # An untracked tracker: a delivered group finishes nothing, as the path does not matter here.
    tracker = OffsetTracker()
    sources = [position_of(m) for m in without]
    labels: Counter[OutputLabel] = Counter({("decision", "approve"): batch})
    # Case after case for each batch, in a rotating order: a shared machine's load drifts, and
    # the cases should see the same drift.
    us_per_batch: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for index in range(batches * (rounds + 1)):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            group = OutcomeGroup(tracker, sources, labels, lambda _labels: None)
            started = time.perf_counter()
            cases[name](sink, topic, group)
            elapsed = time.perf_counter() - started
            producer.flush(30)
            if index >= batches:  # the first `batches` warm up: not counted
                us_per_batch[name].append(elapsed * 1e6)
    medians = {name: statistics.median(times) for name, times in us_per_batch.items()}
    return {
        "batch": batch,
        "batches": batches,
        "rounds": rounds,
        "us_per_batch": {name: round(us, 1) for name, us in medians.items()},
        "ratio_to_before": {name: round(us / medians["before"], 2) for name, us in medians.items()},
        "otel": tracer is not None,
    }


if __name__ == "__main__":
    raise SystemExit(main())
