"""The one reader of Prometheus text the tools and tests use: escaped label values (a comma,
a quote, an equals sign in a value), which a split on commas broke, come back whole."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from plumbing.metrics_text import by_key, samples, totals


def test_labels_with_commas_quotes_and_equals_signs_come_back_whole() -> None:
    registry = CollectorRegistry()
    skipped = Counter("x_skipped", "help", ["reason", "topic"], registry=registry)
    skipped.labels('a,b="c"', "t").inc(3)
    skipped.labels("plain", "t").inc(2)
    Gauge("x_open", "help", registry=registry).set(1.5)
    text = generate_latest(registry).decode()
    found = {
        (s.name, tuple(s.labels.items())): s.value
        for s in samples(text)
        if s.name != "x_skipped_created"
    }
    assert found[("x_skipped_total", (("reason", 'a,b="c"'), ("topic", "t")))] == 3
    # A key is the sample's line as exposed, so a test names a sample as it reads it.
    keys = by_key(text)
    exposed = {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("x_")}
    assert set(keys) == exposed
    assert keys['x_skipped_total{reason="plain",topic="t"}'] == 2
    assert totals(text)["x_skipped_total"] == 5
    assert totals(text)["x_open"] == 1.5
