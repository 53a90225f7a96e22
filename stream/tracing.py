"""Batch spans: one OpenTelemetry span per scored batch, linked to the trace of every record in it.

Responsibilities:
- decide once, at start-up, whether spans are on (`batch_tracer`): an OTLP endpoint is set
  (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the SDK is not
  disabled (`OTEL_SDK_DISABLED`) and the `otel` extra is installed. Otherwise there is no tracer
  at all (None) and nothing of OpenTelemetry is ever imported: the scoring stage checks for None
  once per batch, and that is the whole cost;
- the span (`BatchTracer.batch_scored`): named `score <input topic>`, kind CONSUMER, from the
  start of scoring to the batch's outputs handed to the sink, with OpenTelemetry's messaging
  attributes and the batch's outcome;
- its links (`linked_contexts`): one per record whose `traceparent` parses (its trace id, span
  id and flags); a record without one, or with one that does not parse, gets none.

Key design decisions:
- Links, not a parent: a batch answers as many traces as it has records (OpenTelemetry's
  messaging conventions for batch processing). The span is the root of a trace of its own.
- The SDK reads its own `OTEL_*` settings (service name, exporter headers and timeouts, sampler);
  this module only chooses what the SDK cannot know: the default service name, the instance, and
  a link limit of the batch cap up to MAX_LINKS_PER_SPAN, since the SDK's default (128) would
  drop the links of half of a default batch (256). `OTEL_SPAN_LINK_COUNT_LIMIT` may lower it.
- What the spans may hold is bounded in bytes (SPAN_MEMORY_BYTES), whatever the records carry
  and however long the collector does not answer: each span keeps at most MAX_LINKS_PER_SPAN
  links (the first records'), and the batch processor's queue holds as many spans as fit in the
  bound with the batch being exported (`span_bounds`); spans beyond it are dropped. With the
  SDK's own queue (2,048 spans) of 256 links each, a collector that was down held about 290 MB.
- A link leaves the record's `tracestate` out (its decision still carries it): parsing one with
  the SDK cost more than the rest of the link (bench/trace_context.py), and a link needs only
  the ids to join the record's trace to the batch.
- Spans go out through the SDK's batch processor, on its own thread: exporting never blocks
  scoring, and an unreachable collector costs dropped spans, never decisions.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from contracts.dead_letter import Headers
from contracts.trace_context import TRACEPARENT, TraceParent, parse_traceparent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: Either turns spans on; OpenTelemetry's exporter reads them itself.
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SERVICE_NAME = "fraud-scorer"
LINK_LIMIT_VARIABLE = "OTEL_SPAN_LINK_COUNT_LIMIT"

#: The most links a span keeps: every record of a default batch (256); a larger batch links its
#: first records only.
MAX_LINKS_PER_SPAN = 256
#: What the spans waiting for the collector may hold at most: the processor's queue and the
#: batch being exported.
SPAN_MEMORY_BYTES = 16 * 1_048_576
#: What a span costs in the SDK, without its links, and each link (about 440 bytes measured
#: with SDK 1.45: the Link, its SpanContext and TraceFlags), rounded up.
SPAN_BYTES = 4_096
LINK_BYTES = 512
#: The SDK's default queue, the most spans kept even when they hold no links.
MAX_QUEUED_SPANS = 2_048

#: The trace headers of a batch's records, in order (`batch_trace_headers`); None: none has any.
Contexts = Sequence[Headers | None] | None


class BatchOutcome(NamedTuple):
    """What became of a batch's records, as its span reports it."""

    size: int
    decided: int
    dead_lettered: int
    model_version: str


class BatchTracer(Protocol):
    """Records one span per scored batch."""

    def batch_scored(self, contexts: Contexts, elapsed_s: float, outcome: BatchOutcome) -> None:
        """The batch whose records carried `contexts` was scored in the `elapsed_s` seconds
        that just ended."""

    def close(self) -> None:
        """Send what is still held (within the exporter's own timeout); at the replica's stop."""


def linked_contexts(contexts: Contexts, limit: int = MAX_LINKS_PER_SPAN) -> list[TraceParent]:
    """The trace contexts a batch's span links to: one per record whose `traceparent` parses,
    in the records' order, the first `limit` of them."""
    if contexts is None or limit <= 0:
        return []
    linked = []
    for headers in contexts:
        # `trace_context` puts the traceparent first when there is one.
        if headers is not None and headers[0][0] == TRACEPARENT:
            parent = parse_traceparent(headers[0][1])
            if parent is not None:
                linked.append(parent)
                if len(linked) == limit:
                    break
    return linked


class SpanBounds(NamedTuple):
    """How much the SDK may hold: links per span, spans queued, spans per export."""

    max_links: int
    max_queue_size: int
    max_export_batch_size: int


def span_bounds(max_batch_size: int, environ: Mapping[str, str] = os.environ) -> SpanBounds:
    """The link limit (the batch cap, at most MAX_LINKS_PER_SPAN, lowered by
    `OTEL_SPAN_LINK_COUNT_LIMIT`), and the queue that keeps spans of that many links within
    SPAN_MEMORY_BYTES together with the batch being exported (a quarter of the queue)."""
    links = min(max_batch_size, MAX_LINKS_PER_SPAN)
    asked = environ.get(LINK_LIMIT_VARIABLE, "").strip()
    if asked.isdigit():
        links = min(links, int(asked))
    span_bytes = SPAN_BYTES + links * LINK_BYTES
    queue = max(1, min(MAX_QUEUED_SPANS, SPAN_MEMORY_BYTES * 4 // (5 * span_bytes)))
    return SpanBounds(links, queue, max(1, queue // 4))


def spans_requested(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for spans: an OTLP endpoint set, the SDK not disabled."""
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return not disabled and any(environ.get(name) for name in ENDPOINT_VARIABLES)


def batch_tracer(
    *,
    input_topic: str,
    group_id: str,
    instance_id: str,
    max_batch_size: int,
    environ: Mapping[str, str] = os.environ,
) -> BatchTracer | None:
    """The replica's batch tracer exporting OTLP over HTTP, or None when spans are not asked
    for (see the module docstring) or the `otel` extra is missing (a warning says so)."""
    if not spans_requested(environ):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "an OTLP endpoint is set but OpenTelemetry is not installed (%s): no batch spans; "
            "install the extra: pip install 'fraud-scorer[otel]'",
            exc,
        )
        return None
    bounds = span_bounds(max_batch_size, environ)
    return OtelBatchTracer.create(
        BatchSpanProcessor(
            OTLPSpanExporter(),
            max_queue_size=bounds.max_queue_size,
            max_export_batch_size=bounds.max_export_batch_size,
        ),
        input_topic=input_topic,
        group_id=group_id,
        instance_id=instance_id,
        max_batch_size=max_batch_size,
        environ=environ,
    )


class OtelBatchTracer:
    """A `BatchTracer` on an OpenTelemetry SDK tracer provider of its own (never the global
    one: the replica's spans do not depend on what else the process configured)."""

    def __init__(
        self,
        provider: TracerProvider,
        *,
        input_topic: str,
        group_id: str,
        max_links: int = MAX_LINKS_PER_SPAN,
    ) -> None:
        self._provider = provider
        self._tracer: Tracer = provider.get_tracer(__name__)
        self._max_links = max_links
        self._name = f"score {input_topic}"
        self._attributes: dict[str, str] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "score",
            "messaging.destination.name": input_topic,
            "messaging.consumer.group.name": group_id,
        }

    @classmethod
    def create(
        cls,
        processor: SpanProcessor,
        *,
        input_topic: str,
        group_id: str,
        instance_id: str,
        max_batch_size: int,
        environ: Mapping[str, str] = os.environ,
    ) -> OtelBatchTracer:
        """A tracer whose spans go to `processor` (the OTLP exporter's, or a test's)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider

        resource = Resource.create(
            {
                "service.name": environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME,
                "service.instance.id": instance_id,
            }
        )
        max_links = span_bounds(max_batch_size, environ).max_links
        provider = TracerProvider(resource=resource, span_limits=SpanLimits(max_links=max_links))
        provider.add_span_processor(processor)
        return cls(provider, input_topic=input_topic, group_id=group_id, max_links=max_links)

    def close(self) -> None:
        """Export what is queued (within the exporter's timeout) and stop the export thread."""
        self._provider.shutdown()

    def batch_scored(self, contexts: Contexts, elapsed_s: float, outcome: BatchOutcome) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

        links = [
            Link(
                SpanContext(p.trace_id, p.span_id, is_remote=True, trace_flags=TraceFlags(p.flags))
            )
            for p in linked_contexts(contexts, self._max_links)
        ]
        ended_ns = time.time_ns()
        span = self._tracer.start_span(
            self._name,
            context=Context(),  # a root: the records' traces are links
            kind=SpanKind.CONSUMER,
            attributes={
                **self._attributes,
                "messaging.batch.message_count": outcome.size,
                "fraud.decisions": outcome.decided,
                "fraud.dead_letters": outcome.dead_lettered,
                "fraud.model_version": outcome.model_version,
            },
            links=links,
            start_time=ended_ns - round(elapsed_s * 1e9),
        )
        span.end(end_time=ended_ns)
