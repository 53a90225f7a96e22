"""`make flywheel`: the data flywheel end to end on the simulator, through the real broker.

1. **v1 serves.** One replica scores with the shipped model through a link (`champion`), every
   decision carrying its feature row (FRAUD_DECISION_FEATURES=on), a challenger link in shadow.
2. **The world drifts.** After `drift_day` simulated days the simulator switches a fraud pattern
   on that v1 was never trained on (account takeover: night-time e-commerce purchases abroad at
   the card's usual amounts, `simulator/fraud.py`).
3. **Labels arrive**: the outcomes reported so far go to the labels topic, as the label regime
   reports them (`simulator/label_regimes.py`). Under `capacity` (the default) analysts review
   what v1 flagged (its review and decline decisions), `reviews_per_day` cases a day, highest
   expected loss (v1's score x amount) first, and the approved transactions of the audit sample
   (`audit_share`); every other fraud waits for its chargeback. Under `chargebacks` every fraud
   waits for its chargeback; under `today` the simulator's own outcomes arrive.
4. **v2 is trained from the topics** (`fraud-train from-topics --audit-share --audit-weight`):
   decisions joined to labels as of now.
5. **v2 runs in shadow**: promoted into the challenger link, the replica reloads it and scores
   the next `late_days` days with both; v1 still decides.
6. **v2 is promoted** into the champion link and serves the days after, without a restart.

It prints recall at a fixed false-positive rate (the share of legitimate transactions flagged)
for v1 and v2 on the same late window, overall and on the new pattern, from the shadow topic
(both models' scores of every transaction) and the simulator's truth, and writes them to
`--out`/summary.json. Simulated time runs compressed (`--rate` event-time transactions a
second), the label regime's hours and days with it; there is no features worker, so terminal
risk is neutral for both models. The summary also counts the labels by how they came (review,
audit, chargeback), on the new pattern too, the reviews a day they cost, and the share of
approved transactions the audits found fraud before and after the drift.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from flywheel.labels import reported_labels
from flywheel.settings import FlywheelSettings
from model_tools.cli import main as fraud_model
from plumbing.metrics_text import by_key, scrape
from simulator.label_regimes import LabelRegime
from simulator.transactions import SimulatedBatch, TransactionSimulator
from stream.startup.config import SHIPPED_MODEL_PATH
from training.from_topics import fpr_cut, recall_at_fpr
from training.from_topics import main as fraud_train

REPO = Path(__file__).resolve().parents[1]
#: The false-positive rate the two models' recall is compared at.
FPR = 0.01
#: Simulated transactions per day of the default population (5,000 cards, U(0, 4) a day each).
_ROWS_PER_DAY_PER_CARD = 2.0
WAIT_S = 300.0


class Window(NamedTuple):
    """One model's figures on the late window."""

    recall_all: float
    recall_new_pattern: float
    #: Legitimate transactions above the cut of FPR (about FPR: the two compare at equal cost).
    flagged_legit: float
    #: Legitimate transactions its own thresholds send to review or decline (its manifest's
    #: goal: at most 1 %), and frauds they catch.
    reviewed_legit: float
    caught_by_thresholds: float


def run(settings: FlywheelSettings) -> dict[str, Any]:
    """The whole loop; returns (and writes) its summary."""
    out = settings.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_id = uuid.uuid4().hex[:8]
    topics = {role: f"flywheel-{run_id}-{role}" for role in ("tx", "decisions", "dlq", "labels")}
    topics["shadow"] = f"{topics['decisions']}.shadow"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics.values()]).values():
        future.result(timeout=30)
    champion, challenger = out / "champion", out / "challenger"
    for link in (champion, challenger):
        _cli(
            "fraud-model promote",
            fraud_model,
            ["promote", str(SHIPPED_MODEL_PATH), "--source", str(link)],
        )

    days = settings.train_days + settings.late_days + settings.served_days
    rows_per_day = int(settings.cards * _ROWS_PER_DAY_PER_CARD)
    span_ms = int(days * rows_per_day / settings.rate * 1000)
    start_ms = time.time_ns() // 1_000_000 - span_ms - 60_000
    simulator = TransactionSimulator(
        settings.seed,
        num_cards=settings.cards,
        num_terminals=2 * settings.cards,
        start_time_ms=start_ms,
        id_prefix=f"fw{run_id}",
    )
    warm = simulator.generate(settings.drift_day * rows_per_day, rate_per_s=settings.rate)
    service = _start_service(settings, topics, champion, challenger, warm.time_scale, out)
    try:
        _say(f"1. v1 ({_version(champion)}) serves {settings.train_days} simulated days")
        _produce(settings.bootstrap, topics["tx"], warm)
        simulator.start_account_takeovers()
        _say(f"2. the world drifts: account takeovers from day {settings.drift_day}")
        drifted = simulator.generate(
            (settings.train_days - settings.drift_day) * rows_per_day, rate_per_s=settings.rate
        )
        _produce(settings.bootstrap, topics["tx"], drifted)
        decided = len(warm.records) + len(drifted.records)
        v1_decisions = _decode(_read(settings.bootstrap, topics["decisions"], decided))
        labels, sources = reported_labels(settings, start_ms, warm, drifted, v1_decisions)
        _say(
            f"3. labels arrive ({settings.regime}): {len(labels)} outcomes reported so far, "
            f"{sources['reviews']} reviewed, {sources['audits']} of them audits"
        )
        _produce_labels(settings.bootstrap, topics["labels"], labels)

        v2 = out / "v2"
        _say("4. v2 is trained from the topics")
        began = time.monotonic()
        _cli(
            "fraud-train from-topics",
            fraud_train,
            [
                "--bootstrap-servers",
                settings.bootstrap,
                "--decisions-topic",
                topics["decisions"],
                "--labels-topic",
                topics["labels"],
                "--audit-share",
                # Only the capacity regime's analysts audit: the trainer is told what happened.
                str(settings.audit_share if settings.regime is LabelRegime.CAPACITY else 0.0),
                "--audit-weight",
                str(settings.audit_weight),
                "--validation-share",
                str(settings.validation_share),
                "--evaluation-share",
                str(settings.evaluation_share),
                "--out",
                str(v2),
            ],
        )
        trained_s = time.monotonic() - began
        _say(f"5. v2 ({_version(v2)}) runs in shadow for {settings.late_days} days")
        _cli("fraud-model promote", fraud_model, ["promote", str(v2), "--source", str(challenger)])
        _wait_for_metric(
            service,
            settings.metrics_port,
            'fraud_model_reloads_total{result="loaded",role="shadow"}',
        )
        late = simulator.generate(settings.late_days * rows_per_day, rate_per_s=settings.rate)
        _produce(settings.bootstrap, topics["tx"], late)
        # Every decision so far has its shadow record: v1 in shadow of itself, then v2.
        shadows = _decode(_read(settings.bootstrap, topics["shadow"], decided + len(late.records)))
        late_ids = {str(r["transaction_id"]): i for i, r in enumerate(late.records)}
        scored = [s for s in shadows if s["transaction_id"] in late_ids]
        v1_window, v2_window, agreement = _compare(scored, late_ids, late)

        _say(f"6. v2 is promoted and serves {settings.served_days} days")
        _cli("fraud-model promote", fraud_model, ["promote", str(v2), "--source", str(champion)])
        _wait_for_metric(
            service,
            settings.metrics_port,
            'fraud_model_reloads_total{result="loaded",role="served"}',
        )
        served = simulator.generate(settings.served_days * rows_per_day, rate_per_s=settings.rate)
        _produce(settings.bootstrap, topics["tx"], served)
        total = decided + len(late.records) + len(served.records)
        decisions = _decode(_read(settings.bootstrap, topics["decisions"], total))
        served_ids = {str(r["transaction_id"]) for r in served.records}
        served_versions = sorted(
            {str(d["model_version"]) for d in decisions if d["transaction_id"] in served_ids}
        )
    finally:
        _stop(service)
        admin.delete_topics(list(topics.values()))
    summary = {
        "settings": {
            k: str(v) if isinstance(v, Path) else v for k, v in settings._asdict().items()
        },
        "v1": _version(SHIPPED_MODEL_PATH),
        "v2": _version(v2),
        "transactions": total,
        "labels_used": len(labels),
        "labels": sources,
        "train_seconds": round(trained_s, 1),
        "late_window": {
            "transactions": len(scored),
            "frauds": int(late.is_fraud.sum()),
            "new_pattern_frauds": int((late.scenario == "account_takeover").sum()),
            "fpr": FPR,
            "v1": v1_window._asdict(),
            "v2": v2_window._asdict(),
            "decisions_agreeing": agreement,
        },
        "served_after_promotion": served_versions,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(summary)
    return summary


def _compare(
    scored: list[dict[str, Any]], late_ids: dict[str, int], late: SimulatedBatch
) -> tuple[Window, Window, float]:
    rows = np.array([late_ids[s["transaction_id"]] for s in scored], np.int64)
    is_fraud = late.is_fraud[rows]
    new_pattern = late.scenario[rows] == "account_takeover"
    v1 = np.array([s["served_score"] for s in scored])
    v2 = np.array([s["score"] for s in scored])
    v1_flags = np.array([s["served_decision"] != "approve" for s in scored])
    v2_flags = np.array([s["decision"] != "approve" for s in scored])
    agreeing = float(np.mean([s["served_decision"] == s["decision"] for s in scored]))
    return (
        _window(v1, v1_flags, is_fraud, new_pattern),
        _window(v2, v2_flags, is_fraud, new_pattern),
        round(agreeing, 4),
    )


def _window(
    scores: npt.NDArray[np.float64],
    flagged: npt.NDArray[np.bool_],
    is_fraud: npt.NDArray[np.bool_],
    new: npt.NDArray[np.bool_],
) -> Window:
    """Recall at FPR overall and on the new pattern (the same cut: FPR of legitimate rows), and
    what the model's own thresholds flag (`flagged`)."""
    cut = fpr_cut(is_fraud, scores, FPR)
    on_new = scores[new & is_fraud]
    return Window(
        round(recall_at_fpr(is_fraud, scores, FPR), 4),
        round(float((on_new > cut).mean()) if len(on_new) else float("nan"), 4),
        round(float((scores[~is_fraud] > cut).mean()), 4),
        round(float(flagged[~is_fraud].mean()), 4),
        round(float(flagged[is_fraud].mean()), 4),
    )


def _print_summary(summary: dict[str, Any]) -> None:
    late = summary["late_window"]
    print(
        f"\nflywheel: the late window ({late['transactions']:,} transactions, {late['frauds']} "
        f"frauds, {late['new_pattern_frauds']} of them account takeovers), scored by both:"
    )
    print(f"  recall at a {FPR:.0%} false-positive rate    all frauds   account takeovers")
    for name in ("v1", "v2"):
        window = late[name]
        print(
            f"  {name} {summary[name]:<34} {window['recall_all']:>9.3f}   "
            f"{window['recall_new_pattern']:>17.3f}"
        )
    print(
        "  by their own thresholds: v1 flags {:.2%} of legitimate transactions and catches "
        "{:.1%} of frauds, v2 {:.2%} and {:.1%}; their decisions agree on {:.2%}".format(
            late["v1"]["reviewed_legit"],
            late["v1"]["caught_by_thresholds"],
            late["v2"]["reviewed_legit"],
            late["v2"]["caught_by_thresholds"],
            late["decisions_agreeing"],
        )
    )
    print(
        f"  v2 trained from the topics in {summary['train_seconds']} s on "
        f"{summary['labels_used']} labels; after promotion the decisions came from "
        f"{', '.join(summary['served_after_promotion'])}"
    )


def _version(package: Path) -> str:
    import tomllib

    manifest = tomllib.loads((package / "model.toml").read_text())
    return str(manifest["model"]["version"])


def _cli(name: str, command: Any, argv: Sequence[str]) -> None:
    code = command(list(argv))
    if code != 0:
        raise RuntimeError(f"{name} exited with status {code}")


def _say(text: str) -> None:
    print(f"flywheel: {text}", flush=True)


def _start_service(
    settings: FlywheelSettings,
    topics: dict[str, str],
    champion: Path,
    challenger: Path,
    time_scale: float,
    out: Path,
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "stream",
        "run",
        "--bootstrap-servers",
        settings.bootstrap,
        "--input-topic",
        topics["tx"],
        "--output-topic",
        topics["decisions"],
        "--dlq-topic",
        topics["dlq"],
        "--group-id",
        f"{topics['tx']}-scorer",
        "--terminal-risk-topic",
        f"{topics['tx']}-terminal-risk",
        "--card-frauds-topic",
        f"{topics['tx']}-card-frauds",
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(settings.metrics_port),
        "--model-path",
        str(champion),
        "--shadow-model",
        str(challenger),
        "--model-poll-s",
        "0.5",
        "--decision-features",
        "on",
        "--history-time-scale",
        str(time_scale),
    ]
    with (out / "scorer.log").open("wb") as log:  # the child keeps its own handle
        service = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    _wait_for_metric(service, settings.metrics_port, "fraud_records_consumed_total", at_least=0)
    return service


def _wait_for_metric(
    service: subprocess.Popen[bytes], port: int, key: str, at_least: float = 1
) -> None:
    """Wait until the scorer's sample `key` (`Sample.key`: name and labels) reaches `at_least`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise RuntimeError(f"the scorer exited with status {service.returncode}")
        try:
            if by_key(scrape(f"http://127.0.0.1:{port}/metrics")).get(key, -1.0) >= at_least:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{key} did not reach {at_least} within {WAIT_S:g} s")


def _stop(service: subprocess.Popen[bytes]) -> None:
    if service.poll() is None:
        service.terminate()
        try:
            service.wait(60)
        except subprocess.TimeoutExpired:
            service.kill()


def _produce(bootstrap: str, topic: str, batch: SimulatedBatch) -> None:
    _produce_values(
        bootstrap, topic, [(str(r["card_id"]), msgspec.json.encode(r)) for r in batch.records]
    )


def _produce_labels(bootstrap: str, topic: str, labels: list[dict[str, object]]) -> None:
    _produce_values(
        bootstrap, topic, [(str(label["card_id"]), msgspec.json.encode(label)) for label in labels]
    )


def _produce_values(bootstrap: str, topic: str, values: list[tuple[str, bytes]]) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True}
    )
    for key, value in values:
        while True:
            try:
                producer.produce(topic, value, key.encode())
                break
            except BufferError:
                producer.poll(0.2)
    if producer.flush(60):
        raise RuntimeError(f"records to {topic} not acknowledged within 60 s")


def _read(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """Every record on `topic` now (at least `expected`, waiting for them up to WAIT_S)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"flywheel-reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            messages = consumer.consume(10_000, 0.5)
            for message in messages:
                value = message.value()
                if message.error() is None and value:
                    values.append(value)
            if messages:
                quiet_since = time.monotonic()
            elif len(values) >= expected and time.monotonic() - quiet_since > 2.0:
                return values
    finally:
        consumer.close()
    raise RuntimeError(f"{topic} holds {len(values)} records, {expected} expected")


def _decode(values: list[bytes]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(value) for value in values]
