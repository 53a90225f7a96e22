"""The faust-streaming contender: the framework a Python team would reach for, doing the
service's job with `Stream.take(max_, within)` micro-batches and the same scoring work
(bench/decide.py: decode, features, one ONNX Runtime call per batch, decisions).

Faust's own defaults otherwise (aiokafka underneath, acks=all). Configured by environment
variables, since faust's command line belongs to faust:

    BENCH_BOOTSTRAP_SERVERS, BENCH_INPUT_TOPIC, BENCH_OUTPUT_TOPIC, BENCH_GROUP_ID,
    BENCH_DATADIR (faust's state directory)

Run as `python -m bench.faust_app worker -l warn`.
"""

from __future__ import annotations

import os

import faust

from bench.decide import MAX_BATCH_SIZE, MAX_WAIT_S, Decider

app = faust.App(
    os.environ.get("BENCH_GROUP_ID", "bench-faust"),
    broker=f"kafka://{os.environ.get('BENCH_BOOTSTRAP_SERVERS', '127.0.0.1:9092')}",
    datadir=os.environ.get("BENCH_DATADIR", "/tmp/bench-faust"),
    consumer_auto_offset_reset="earliest",
    # No web server, no leader-election topic: the benchmark runs one worker and needs neither.
    web_enabled=False,
    topic_disable_leader=True,
)
transactions = app.topic(
    os.environ.get("BENCH_INPUT_TOPIC", "transactions"),
    key_serializer="raw",
    value_serializer="raw",
)
decisions = app.topic(
    os.environ.get("BENCH_OUTPUT_TOPIC", "decisions"), key_serializer="raw", value_serializer="raw"
)
decider: Decider | None = None


@app.agent(transactions)
async def score(stream: faust.StreamT[bytes]) -> None:
    """Decide each micro-batch of at most MAX_BATCH_SIZE records, closed MAX_WAIT_S after its
    first record at the latest, and send one decision per record."""
    global decider
    if decider is None:  # built in the worker, not at import by faust's command line
        decider = Decider()
    async for values in stream.take(MAX_BATCH_SIZE, within=MAX_WAIT_S):
        for key, value in decider.decide(values):
            await decisions.send(key=key, value=value)


if __name__ == "__main__":
    app.main()
