"""A service asked for a GPU on a machine without one still decides every record, on the CPU.

The device comes from the environment (`FRAUD_DEVICE`), as in a deployment manifest; the child
process inherits the test's environment. CI has no GPU, so this is the fallback path.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from scorer.model_package import load_model_package
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.integration.conftest import produce, read_topic
from tests.integration.test_pipeline import decisions_of, simulated

CPU_PROVIDER_METRIC = 'fraud_execution_provider_info{provider="CPUExecutionProvider"}'


@pytest.mark.parametrize("device", ["cuda", "tensorrt"])
def test_a_gpu_request_without_a_gpu_decides_every_record_on_the_cpu(
    topics_factory, service_factory, monkeypatch, device
):
    monkeypatch.setenv("FRAUD_DEVICE", device)
    topics = topics_factory(partitions=2)
    records, sent = simulated(2000, seed=17, prefix=device)
    produce(topics.input, records)
    service = service_factory(topics, "--max-batch-size", "128")

    decisions = decisions_of(topics.output, len(sent))

    assert Counter(d["transaction_id"] for d in decisions) == Counter(
        r["transaction_id"] for r in sent
    )
    assert all(d["degraded"] is False and 0.0 <= d["score"] <= 1.0 for d in decisions)
    assert read_topic(topics.dlq, 0) == [], "no record is dead-lettered"
    service.wait_for_metric(CPU_PROVIDER_METRIC, 1)
    # The shipped package's expected flag rate, which FraudFlagRateUnexpected compares with.
    low, high = load_model_package(SHIPPED_MODEL_PATH).manifest.thresholds.expected_flag_rate
    assert service.metric('fraud_model_expected_flag_ratio{bound="low"}') == low
    assert service.metric('fraud_model_expected_flag_ratio{bound="high"}') == high
    service.signal(signal.SIGTERM)
    assert service.wait() == 0
    log = service.log_path.read_text()
    fallbacks = [line for line in log.splitlines() if f"device={device} asked for" in line]
    assert len(fallbacks) == 1 and "WARNING" in fallbacks[0], log
    assert "scoring on CPUExecutionProvider instead" in fallbacks[0]
    assert "provider=CPUExecutionProvider" in log, "the startup log names the provider in use"
    assert "warmed up every batch shape" in log
