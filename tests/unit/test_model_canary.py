"""A model that scores the all-zeros row and returns NaN for real transactions: refused before
it serves (typical rows, and a ring of recent real rows the scoring stage keeps), treated as
broken rather than its records as poison, and, should it serve anyway and fail most records of
a batch the model before it decides, rolled back to that model with nothing dead-lettered."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from contracts.dead_letter import MODEL_VERSION
from contracts.offsets import OffsetTracker
from contracts.transaction import decode_transaction
from deadletter.router import DeadLetterRouter
from plumbing.errors import ConfigurationError, ModelUnavailableError
from scorer.card_history import CardHistory
from scorer.columns import TransactionColumns
from scorer.decide import DecisionPolicy, decide_batch
from scorer.decisions import Thresholds
from scorer.features import FEATURE_NAMES, NUM_FEATURES, build_features
from scorer.isolation import check_canary
from scorer.model_package import promote
from scorer.model_source import DirectorySource
from scorer.recent_rows import ROWS_PER_BATCH, RecentRows
from simulator.transactions import TransactionSimulator
from stream.batcher import Batch
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, ServingModel, load_serving_model
from stream.owned_card_history import OwnedCardHistory
from stream.package_check import sanity_check
from stream.pending_record import PendingRecord
from stream.scoring import BatchScorer
from stream.startup.config import ScorerSettings
from stream.typical_rows import typical_rows
from tests.support.budget import MIB, Budget, within
from tests.support.models import (
    BURST,
    POISON_AMOUNT,
    SEEN_BEFORE,
    nan_on_burst_model,
    nan_on_history_model,
    nan_on_real_rows_model,
    package,
)
from tests.unit.fakes import FakeScorer, MemoryChangelog, MemorySink, message
from tests.unit.test_model_reload import package_copy, reloads

CARDS = 5


def transactions(n: int, cards: int = CARDS, start: int = 0) -> list[bytes]:
    """`n` transactions of `cards` cards taking turns (all but each card's first have
    history), event times now."""
    records = TransactionSimulator(5).generate(n).records
    now_ms = time.time_ns() // 1_000_000
    return [
        msgspec.json.encode(
            {**r, "card_id": f"card-{i % cards}", "transaction_id": f"t-{start + i}",
             "event_time": now_ms}
        )
        for i, r in enumerate(records, start=start)
    ]  # fmt: skip


def batch_of(values: list[bytes], first_offset: int = 0) -> Batch[PendingRecord]:
    items = [
        PendingRecord(
            message(first_offset + i, v), decode_transaction(v), (("tx", 0), first_offset + i)
        )
        for i, v in enumerate(values)
    ]
    return Batch(items, 0.0, 0.005, closed_full=True)


def rows_with_history(n: int = 40) -> np.ndarray:
    """Feature rows of real transactions of cards seen before (their history counted)."""
    decoded = [decode_transaction(v) for v in transactions(n)]
    columns = TransactionColumns.from_transactions(decoded)
    history = CardHistory().update_and_features(
        columns.card_id, columns, columns.merchant_id, np.arange(n, dtype=np.int64)
    )
    return build_features(columns, history)


@pytest.fixture
def link(tmp_path: Path) -> Path:
    champion = tmp_path / "champion"
    champion.symlink_to(package_copy(tmp_path / "good", "good"))
    return champion


def reloader_on(
    link: Path, registry: CollectorRegistry, recent: RecentRows | None = None
) -> tuple[ModelReloader, ServingModel, ServiceMetrics]:
    config = ScorerSettings(model_path=str(link), model_poll_s=60.0)
    source = DirectorySource(link)
    serving = load_serving_model(config, source)
    metrics = ServiceMetrics(registry)
    reloader = ModelReloader(config, metrics, serving, source=source, recent=recent)
    return reloader, serving, metrics


# --- before the swap ----------------------------------------------------------------------------


def test_a_model_that_returns_nan_for_real_transactions_is_refused_before_it_serves(
    link: Path, tmp_path: Path
):
    """No traffic seen yet: the typical rows (real transactions' features, a card's first)
    are enough to refuse a model that fails every row with an amount."""
    registry = CollectorRegistry()
    reloader, _, _ = reloader_on(link, registry)
    promote(package(tmp_path / "nan", nan_on_real_rows_model(), version="nan"), link)
    assert not reloader.check_now() and reloader.take() is None
    assert reloads(registry, "refused") == 1 and reloads(registry, "loaded") == 0


def test_a_model_that_returns_nan_for_any_card_with_history_is_refused_without_traffic(
    link: Path, tmp_path: Path
):
    """No traffic seen yet, nothing to roll back to at a start: the typical rows hold cards with
    history, so a model that scores zeros and a card's first transaction, and NaN for any card
    seen before, is refused before it serves."""
    registry = CollectorRegistry()
    reloader, _, _ = reloader_on(link, registry)
    bad = package(tmp_path / "history-nan", nan_on_history_model(), version="history-nan")
    with pytest.raises(ConfigurationError, match=r"typical transactions.*not a probability"):
        sanity_check(load_serving_model(ScorerSettings(), DirectorySource(bad)).scorer)
    promote(bad, link)
    assert not reloader.check_now() and reloader.take() is None
    assert reloads(registry, "refused") == 1 and reloads(registry, "loaded") == 0


def test_a_model_that_fails_the_recent_real_rows_is_refused_before_it_serves(
    link: Path, tmp_path: Path
):
    """A model that scores every typical row and NaN for a burst of a card's transactions
    within a second, which only the recent real rows (the traffic here) hold."""
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    no_traffic, registry = CollectorRegistry(), CollectorRegistry()
    unseen, _, _ = reloader_on(link, no_traffic)
    recent = RecentRows()
    rows = rows_with_history()
    assert (rows[:, FEATURE_NAMES.index("card_since_previous")] < BURST).mean() > 0.5
    recent.note(rows, np.ones(len(rows), bool))
    seen, _, _ = reloader_on(link, registry, recent)
    promote(bad, link)
    assert unseen.check_now()  # without traffic it passes: the rollback's case, below
    assert not seen.check_now() and seen.take() is None
    assert reloads(registry, "refused") == 1


def test_the_sanity_score_names_the_rows_it_failed(link: Path, tmp_path: Path):
    config = ScorerSettings()
    model = load_serving_model(
        config, DirectorySource(package(tmp_path / "nan", nan_on_real_rows_model()))
    )
    with pytest.raises(Exception, match=r"typical transactions.*not a probability"):
        sanity_check(model.scorer)


# --- the ring of recent rows --------------------------------------------------------------------


def test_the_recent_rows_are_bounded_and_only_rows_a_model_scored():
    recent = RecentRows(capacity=16)
    assert recent.sample().shape == (0, NUM_FEATURES)
    rows = np.arange(100 * NUM_FEATURES, dtype=np.float32).reshape(100, NUM_FEATURES)
    usable = np.zeros(100, bool)
    usable[50:] = True
    recent.note(rows, usable)
    taken = recent.sample()
    assert len(taken) == ROWS_PER_BATCH
    assert set(taken[:, 0] // NUM_FEATURES) <= set(range(50, 100)), "only usable rows"
    for _ in range(20):
        recent.note(rows, usable)
    assert len(recent.sample()) == 16
    sample = recent.sample()
    sample[:] = -1
    assert (recent.sample() >= 0).all(), "a sample is a copy"


def test_the_typical_rows_cover_histories_terminal_risk_and_card_frauds():
    """Rows of a short simulated stream through the real feature code: a card's first
    transaction and cards with history, terminals with frauds reported, cards with confirmed
    frauds, every channel; none holds a burst (the only thing `nan_on_burst_model` fails)."""
    rows = typical_rows()
    column = {name: rows[:, i] for i, name in enumerate(FEATURE_NAMES)}
    assert rows.shape[1] == NUM_FEATURES and 24 <= len(rows) <= 96
    assert np.isfinite(rows).all() and (column["log_amount"] > 0).all()
    assert (column["card_tx_30d"] < SEEN_BEFORE).any()
    assert (column["card_tx_30d"] > SEEN_BEFORE).mean() > 0.5
    assert (column["card_tx_1d"] > np.log1p(3)).any() and (column["card_tx_7d"] > 0).all()
    assert (column["terminal_frauds_7d"] > 0).sum() >= 3
    assert (column["card_fresh_frauds_7d"] > 0).sum() >= 3
    for channel in ("pos", "ecom", "atm"):
        assert column[f"channel_{channel}"].sum() >= 3
    assert (column["card_since_previous"] > BURST).all()
    assert not rows.flags.writeable


def test_the_typical_rows_are_computed_once_and_cheaply():
    with within(Budget(peak_bytes=64 * MIB, seconds=10.0), "a short simulated stream"):
        fresh = typical_rows.__wrapped__()
    assert np.array_equal(fresh, typical_rows()) and typical_rows() is typical_rows()


# --- while it serves: broken, not poison --------------------------------------------------------


def nan_unless_zero(features: np.ndarray) -> np.ndarray:
    return np.where(features.any(axis=1), np.nan, 0.1).astype(np.float32)


def test_a_model_that_fails_most_known_good_rows_is_broken_not_the_records():
    recent = RecentRows()
    rows = rows_with_history()
    recent.note(rows, np.ones(len(rows), bool))
    check_canary(FakeScorer(rule=nan_unless_zero))  # the zeros row alone says nothing
    with pytest.raises(ModelUnavailableError, match="recent"):
        check_canary(FakeScorer(rule=nan_unless_zero), known_good=recent)
    check_canary(FakeScorer(), known_good=recent)

    values = [decode_transaction(v) for v in transactions(12)]
    policy = DecisionPolicy(Thresholds(0.5, 0.8))
    now_ms = time.time_ns() // 1_000_000
    verdicts = decide_batch(values, FakeScorer(rule=nan_unless_zero), policy, now_ms)
    assert len(verdicts.failed) == 12  # today's canary: every record dead-lettered
    verdicts = decide_batch(
        values, FakeScorer(rule=nan_unless_zero), policy, now_ms, known_good=recent
    )
    assert not verdicts.failed and verdicts.degraded.all()  # decided by the rules instead


# --- after the swap: rolled back ----------------------------------------------------------------


def scoring_stage(
    serving: ServingModel,
    reloader: ModelReloader | None,
    metrics: ServiceMetrics,
    sink: MemorySink,
) -> BatchScorer:
    state = OwnedCardHistory(MemoryChangelog(), time_scale=1.0, metrics=metrics)
    state.restore([0])
    return BatchScorer(
        serving.scorer,
        sink,
        OffsetTracker(),
        DeadLetterRouter("tx.dlq", "g/i"),
        output_topic="decisions",
        policy=serving.policy,
        metrics=metrics,
        card_history=state,
        explainer=serving.explainer,
        reloader=reloader,
        recent=RecentRows(),
    )


def test_a_model_that_fails_most_records_after_the_swap_is_rolled_back(link: Path, tmp_path: Path):
    """Loaded before any traffic (nothing shows it yet), the model scores NaN for a burst of a
    card's transactions, which this traffic is: its first batch is decided again by the model
    before it, which serves on; nothing is dead-lettered, the rollback is counted, and the
    package is not offered again."""
    registry, sink = CollectorRegistry(), MemorySink()
    reloader, serving, metrics = reloader_on(link, registry)
    stage = scoring_stage(serving, reloader, metrics, sink)
    promote(package(tmp_path / "burst-nan", nan_on_burst_model(), version="bad"), link)
    assert reloader.check_now()

    stage.process(batch_of(transactions(40)))
    stage.process(batch_of(transactions(40, start=40), first_offset=40))
    kinds = [output.kind for output in sink.sent]
    assert kinds.count("dead_letter") == 0 and kinds.count("decision") == 80
    versions = {
        msgspec.json.decode(o.value or b"")["model_version"]
        for o in sink.sent
        if o.kind == "decision"
    }
    assert versions == {serving.scorer.model_version}
    assert registry.get_sample_value("fraud_model_rollbacks_total") == 1
    assert registry.get_sample_value("fraud_poison_records_total") == 0
    assert not reloader.check_now() and reloader.take() is None


def test_records_that_fail_both_models_are_dead_lettered_and_the_new_model_stays(
    link: Path,
):
    """A batch of poison after a swap is the records' fault, not the new model's: dead-lettered
    under the new model's name, which serves on and decides the next batch alone."""
    registry, sink = CollectorRegistry(), MemorySink()
    poison = float(np.log1p(POISON_AMOUNT))  # the first batch's amounts, no other's
    old_scorer = FakeScorer(raises_on=lambda f: f[:, 0] >= poison)
    new_scorer = FakeScorer(raises_on=lambda f: f[:, 0] >= poison)
    old_scorer.model_version, new_scorer.model_version = "old", "new"
    policy = DecisionPolicy(Thresholds(0.5, 0.8))
    old = ServingModel(old_scorer, policy, None, "old")  # type: ignore[arg-type]
    new = ServingModel(new_scorer, policy, None, "new")  # type: ignore[arg-type]

    class Handing:
        def __init__(self) -> None:
            self.model: ServingModel | None = new

        def take(self) -> ServingModel | None:
            model, self.model = self.model, None
            return model

    stage = scoring_stage(old, Handing(), ServiceMetrics(registry), sink)  # type: ignore[arg-type]
    stage.process(
        batch_of(
            [
                msgspec.json.encode({**msgspec.json.decode(value), "amount": POISON_AMOUNT})
                for value in transactions(8)
            ]
        )
    )
    letters = [o for o in sink.sent if o.kind == "dead_letter"]
    assert len(letters) == 8 and new_scorer.calls and old_scorer.calls  # both were asked
    assert {dict(o.headers or [])[MODEL_VERSION] for o in letters} == {b"new"}
    assert registry.get_sample_value("fraud_model_rollbacks_total") == 0

    old_calls, sink.sent[:] = len(old_scorer.calls), []
    stage.process(batch_of(transactions(8, start=8), first_offset=8))
    decided = [msgspec.json.decode(o.value or b"") for o in sink.sent if o.kind == "decision"]
    assert len(decided) == 8 and {d["model_version"] for d in decided} == {"new"}
    assert len(old_scorer.calls) == old_calls, "the model before was not asked again"
    assert registry.get_sample_value("fraud_model_info", {"model_version": "new"}) == 1


# --- with nothing to roll back to: unavailable, not poison -----------------------------------


def test_a_model_that_fails_most_records_with_nothing_to_roll_back_to_is_unavailable(
    tmp_path: Path,
):
    """A replica started with a model that passes every check and fails most of the traffic
    (no reloader, no model before it): its records are decided by the fallback rules, degraded,
    and none is dead-lettered as poison."""
    registry, sink = CollectorRegistry(), MemorySink()
    metrics = ServiceMetrics(registry)
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    serving = load_serving_model(ScorerSettings(), DirectorySource(bad))
    sanity_check(serving.scorer)  # it passes the start-up check
    stage = scoring_stage(serving, None, metrics, sink)
    stage.process(batch_of(transactions(40)))
    stage.process(batch_of(transactions(40, start=40), first_offset=40))
    kinds = [output.kind for output in sink.sent]
    assert kinds.count("dead_letter") == 0 and kinds.count("decision") == 80
    degraded = [
        msgspec.json.decode(o.value or b"")["degraded"] for o in sink.sent if o.kind == "decision"
    ]
    assert sum(degraded) >= 70
    assert registry.get_sample_value("fraud_poison_records_total") == 0
    assert (
        registry.get_sample_value("fraud_degraded_decisions_total", {"cause": "model_unavailable"})
        or 0
    ) >= 70


@pytest.mark.parametrize("poison", [1, 3, 7])
def test_a_few_poison_records_are_still_dead_lettered_with_nothing_to_roll_back_to(poison: int):
    """Too few failures to judge the model by (its first batch, of a few records all poison):
    they are the records' fault, as ever."""
    registry, sink = CollectorRegistry(), MemorySink()
    policy = DecisionPolicy(Thresholds(0.5, 0.8))
    scorer = FakeScorer(raises_on=lambda f: f[:, 0] > 0)
    model = ServingModel(scorer, policy, None, "fake")  # type: ignore[arg-type]
    stage = scoring_stage(model, None, ServiceMetrics(registry), sink)
    stage.process(batch_of(transactions(poison)))
    assert [o.kind for o in sink.sent].count("dead_letter") == poison
    assert registry.get_sample_value("fraud_poison_records_total") == poison
