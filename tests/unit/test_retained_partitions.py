"""The partitions whose cards are kept after they were given up (stream/retained_partitions.py):
kept for `retain_s`, taken back on a return, expired after."""

from __future__ import annotations

from stream.retained_partitions import RetainedPartition, RetainedPartitions


def test_a_revoked_partition_is_kept_only_when_it_was_owned_and_retain_s_is_set():
    kept = RetainedPartitions(60.0)
    kept.keep_revoked({0: 100, 1: 200}, {0: 5_000}, now=10.0)
    assert 0 in kept and 1 not in kept and len(kept) == 1
    none = RetainedPartitions(0.0)
    none.keep_revoked({0: 100}, {0: 5_000}, now=10.0)
    assert not none.retains and len(none) == 0


def test_a_return_takes_the_partition_back_read_from_its_tail_unless_its_time_passed():
    kept = RetainedPartitions(60.0)
    kept.keep(0, end=100, watermark=5_000, now=10.0)
    kept.keep(1, end=200, watermark=6_000, now=0.0)
    tail, whole = kept.take([0, 1, 2], now=60.0)
    assert tail == {0: RetainedPartition(100, 5_000, 70.0)}
    assert whole == {1}
    assert len(kept) == 0


def test_partitions_past_their_time_expire_and_the_others_stay():
    kept = RetainedPartitions(60.0)
    kept.keep(0, end=100, watermark=5_000, now=0.0)
    kept.keep(1, end=200, watermark=6_000, now=30.0)
    assert kept.expire(now=59.0) == set()
    assert kept.expire(now=60.0) == {0}
    assert 1 in kept
    kept.drop(1)
    kept.drop(1)  # dropping one not kept is nothing
    assert len(kept) == 0
