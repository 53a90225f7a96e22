"""Waking librdkafka's fetchers after a resume, instead of waiting up to a second.

librdkafka serves `resume` on its main thread and only clears the partition's pause flag; the
thread of the partition's leader broker notices at its next wake-up. While that thread has a
fetch in flight (another of its partitions still fetching) that is at once; when every
partition it fetches was paused, it sleeps up to 1 s (`rd_kafka_max_block_ms`), so a resumed
partition waited 0 to 1 s for its first record (`python -m bench.resume_wait`;
docs/benchmarks.md, "Figures behind design choices"; confluent-kafka-go#630 shows the same wait
in librdkafka's debug log). Every partition is paused that way by backpressure, and by
librdkafka itself during each rebalance (it resumes the partitions kept after the assignment
callback). Any request to that broker wakes its
thread, which then fetches: one watermark query per leader of the resumed partitions brought
the wait to 4 ms. It is a short round trip on the consuming thread (4 ms, the query's two
requests and a metadata lookup), and only an optimisation: when it fails, librdkafka fetches
within the second anyway.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: How long each wake-up request may take (a broker slower than this is not waited for).
WAKE_TIMEOUT_S = 0.2


def resume(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Resume `partitions` and wake the broker threads that fetch them."""
    if not partitions:
        return
    consumer.resume(partitions)
    wake(consumer, partitions)


def wake(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Wake the broker threads that fetch `partitions`: one watermark query per leader."""
    if not partitions:
        return
    try:
        for partition in _one_per_leader(consumer, partitions):
            consumer.get_watermark_offsets(partition, timeout=WAKE_TIMEOUT_S, cached=False)
    except KafkaException as exc:
        log.debug("no wake-up after resume (%s): librdkafka fetches within 1 s", exc)


def _one_per_leader(consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
    """A partition of `partitions` for each broker that leads some of them."""
    chosen: dict[int, TopicPartition] = {}
    for topic in sorted({p.topic for p in partitions}):
        metadata = consumer.list_topics(topic, timeout=WAKE_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None:
            continue
        for p in partitions:
            known = metadata.partitions.get(p.partition) if p.topic == topic else None
            if known is not None and known.leader >= 0:
                chosen.setdefault(known.leader, TopicPartition(topic, p.partition))
    return list(chosen.values())
