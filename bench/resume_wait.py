"""How long a paused consumer waits for its first record after a resume, with and without the
wake-up the service sends (`stream/resume.py`).

    python -m bench.resume_wait [--cycles 15] [--rate 2000]

A producer writes `--rate` records/s to a fresh 6-partition topic on the local broker; a
consumer with the service's settings pauses every partition for 100 ms, then resumes them, and
times the first record after the resume. The two ways take turns, cycle by cycle, and the
cycles are 1.47 s apart, so they fall at every phase of librdkafka's one-second broker-thread
sleep. Prints, for each way, the median and the largest wait and how long the resume call itself
held the consuming thread, and one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, Producer

from bench.harness import connect, tool_parser
from stream.resume import resume
from stream.startup.kafka_clients import CONSUMER_DEFAULTS

PARTITIONS = 6
PAUSE_S = 0.1
CYCLE_S = 1.47
RECORD = b"x" * 200


def _produce(bootstrap: str, topic: str, rate: float, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    sent, started = 0, time.monotonic()
    while not stop.is_set():
        producer.produce(topic, RECORD, str(sent).encode())
        sent += 1
        ahead = sent / rate - (time.monotonic() - started)
        if ahead > 0:
            producer.poll(0)
            time.sleep(ahead)
    producer.flush(5)


def _wait_after_resume(consumer: Consumer, how: Callable[[Consumer], None]) -> tuple[float, float]:
    """Pause everything for PAUSE_S, resume `how`; return the seconds the resume call took (the
    consuming thread's cost) and the seconds until the next record."""
    assignment = consumer.assignment()
    consumer.pause(assignment)
    paused_until = time.monotonic() + PAUSE_S
    while time.monotonic() < paused_until:
        consumer.consume(100, 0.005)  # serves callbacks, returns nothing: all paused
    resumed = time.monotonic()
    how(consumer)
    call = time.monotonic() - resumed
    while not consumer.consume(1, 0.005):
        if time.monotonic() - resumed > 5:
            raise RuntimeError("no record within 5 s of a resume: is the producer running?")
    waited = time.monotonic() - resumed
    while consumer.consume(1000, 0):  # catch up before the next cycle
        pass
    return call, waited


def main(argv: Sequence[str] | None = None) -> int:
    parser = tool_parser("python -m bench.resume_wait", __doc__)
    parser.add_argument("--cycles", type=int, default=15, help="cycles per way (default 15)")
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s (default 2000)")
    args = parser.parse_args(argv)
    broker = connect(parser.prog, args.bootstrap_servers)
    if broker is None:
        return 2
    topic = broker.topic("resume-wait", PARTITIONS)
    stop = threading.Event()
    producer = threading.Thread(
        target=_produce, args=(broker.bootstrap, topic, args.rate, stop), daemon=True
    )
    producer.start()
    settings = {k: v for k, v in CONSUMER_DEFAULTS.items() if k != "statistics.interval.ms"}
    consumer = Consumer(
        {
            **settings,
            "bootstrap.servers": broker.bootstrap,
            "group.id": broker.group("resume-wait"),
            "auto.offset.reset": "latest",
            "enable.auto.offset.store": True,
        }
    )
    ways: dict[str, Callable[[Consumer], None]] = {
        "resume only": lambda c: c.resume(c.assignment()),
        "resume and wake (the service)": lambda c: resume(c, c.assignment()),
    }
    waits: dict[str, list[float]] = {name: [] for name in ways}
    calls: dict[str, list[float]] = {name: [] for name in ways}
    try:
        consumer.subscribe([topic])
        while not consumer.assignment():
            consumer.consume(1, 0.1)
        for _ in range(args.cycles):
            for name, how in ways.items():
                started = time.monotonic()
                call, waited = _wait_after_resume(consumer, how)
                calls[name].append(call)
                waits[name].append(waited)
                time.sleep(max(0.0, CYCLE_S - (time.monotonic() - started)))
    finally:
        stop.set()
        consumer.close()
        producer.join(10)
        broker.delete_topics()
    result = {}
    for name, values in waits.items():
        ms = [1000 * v for v in values]
        call_ms = [1000 * v for v in calls[name]]
        result[name] = {
            "median_ms": round(statistics.median(ms), 1),
            "max_ms": round(max(ms), 1),
            "call_median_ms": round(statistics.median(call_ms), 2),
            "call_max_ms": round(max(call_ms), 2),
        }
        print(
            f"{name:32s} first record: median {statistics.median(ms):7.1f} ms, max {max(ms):7.1f}"
            f" ms; the call itself: median {statistics.median(call_ms):5.2f} ms,"
            f" max {max(call_ms):5.2f} ms"
        )
    print(json.dumps({"resume_wait": result, "cycles": args.cycles, "rate": args.rate}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
