"""Reason codes (scorer/reasons.py) on real ONNX models, and through the decision path."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from contracts.transaction import Transaction
from scorer.catalogue import BY_NAME, CATALOGUE
from scorer.columns import TransactionColumns
from scorer.decide import DecisionPolicy, decide_batch
from scorer.decisions import Thresholds
from scorer.features import FEATURE_NAMES, NUM_FEATURES, build_features
from scorer.model import OnnxScorer
from scorer.model_package import load_model_package
from scorer.reasons import Explainer
from scorer.rules import Rules
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.support.models import onnx_model, package
from tests.unit.fakes import FakeScorer
from tests.unit.test_decide import transactions

#: A linear model over five catalogue columns, in an order of its own.
READS = ("card_tx_1h", "log_amount", "night", "terminal_risk_7d", "card_amount_zscore")
WEIGHTS = np.array([0.05, 0.02, 0.1, 0.3, 0.01], np.float32)
POLICY = DecisionPolicy(Thresholds(0.5, 0.8))
SHIPPED = load_model_package(SHIPPED_MODEL_PATH)
SHIPPED_SCORER = OnnxScorer(SHIPPED, "cpu")
SHIPPED_REFERENCE = SHIPPED.reference if SHIPPED.reference is not None else np.zeros(0, np.float32)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def linear(tmp_path: Path) -> OnnxScorer:
    nodes = [
        helper.make_node("MatMul", ["features", "w"], ["z"]),
        helper.make_node("Reshape", ["z", "flat"], ["score"]),
    ]
    weights: dict[str, np.ndarray] = {"w": WEIGHTS[:, None], "flat": np.array([-1], np.int64)}
    model = package(tmp_path / "linear", onnx_model(nodes, weights, ["batch"], READS), READS)
    return OnnxScorer(load_model_package(model), "cpu")


def rows(values: list[dict[str, float]]) -> npt.NDArray[np.float32]:
    out = np.zeros((len(values), NUM_FEATURES), np.float32)
    for i, row in enumerate(values):
        for name, value in row.items():
            out[i, FEATURE_NAMES.index(name)] = value
    return out


def test_contributions_are_the_score_each_feature_adds_over_the_reference(
    tmp_path: Path,
) -> None:
    scorer = linear(tmp_path)
    columns = np.array([FEATURE_NAMES.index(name) for name in READS], np.intp)
    reference = np.array([0.5, 3.0, 0.0, 0.0, 0.0], np.float32)
    explainer = Explainer(scorer, columns, reference)
    features = rows(
        [
            {"card_tx_1h": 3.5, "log_amount": 9.0, "night": 1.0, "terminal_risk_7d": 0.1},
            {
                "card_tx_1h": 0.5,
                "log_amount": 3.0,
                "terminal_risk_7d": 0.9,
                "card_amount_zscore": 4,
            },
        ]
    )
    scores = scorer.score(features)
    first, second = explainer.explain(features, scores)
    # Linear: score(x) - score(x with j at its reference) = w_j * (x_j - reference_j).
    assert [r.feature for r in first] == ["card_tx_1h", "log_amount", "night"]
    assert [r.contribution for r in first] == pytest.approx([0.15, 0.12, 0.1], abs=1e-6)
    assert [r.feature for r in second] == ["terminal_risk_7d", "card_amount_zscore", "card_tx_1h"]
    assert [r.contribution for r in second] == pytest.approx([0.27, 0.04, 0.0], abs=1e-6)
    assert second[0].text == "90% of the terminal's transactions over 7 days were confirmed fraud"
    assert second[0].label == second[0].text  # the deprecated field, written for one release


def test_the_extra_model_call_holds_only_the_flagged_rows(tmp_path: Path) -> None:
    fake = FakeScorer(rule=lambda f: np.where(f[:, 0] > np.log1p(150), 0.9, 0.1).astype(np.float32))
    columns = np.arange(NUM_FEATURES, dtype=np.intp)
    explainer = Explainer(fake, columns, np.zeros(NUM_FEATURES, np.float32))
    batch = transactions(64)
    verdicts = decide_batch(batch, fake, POLICY, now_ms(), explainer=explainer)
    flagged = [i for i, decision in enumerate(verdicts.decisions) if decision != "approve"]
    assert flagged, "the batch holds amounts above 150"
    assert sorted(verdicts.reasons) == flagged
    assert all(len(reasons) == 3 for reasons in verdicts.reasons.values())
    # One extra call: a row per flagged transaction and reason group with a feature away from
    # the reference (zero here).
    reason = np.array([feature.reason for feature in CATALOGUE])
    moved = sum(len(set(reason[row != 0])) for row in build_rows(batch, flagged))
    assert fake.calls == [64, moved]
    assert len(flagged) <= moved < len(flagged) * len(set(reason))
    assert all(verdicts.reasons[i][0].feature == "log_amount" for i in flagged)


def build_rows(batch: list[Transaction], index: list[int]) -> npt.NDArray[np.float32]:
    return build_features(TransactionColumns.from_transactions([batch[i] for i in index]))


def test_a_reasons_call_that_fails_leaves_every_decision_made() -> None:
    scorer = FakeScorer(rule=lambda f: np.full(len(f), 0.9, np.float32))
    failing = FakeScorer(broken=True)
    columns = np.arange(NUM_FEATURES, dtype=np.intp)
    explainer = Explainer(failing, columns, np.zeros(NUM_FEATURES, np.float32))
    verdicts = decide_batch(transactions(8), scorer, POLICY, now_ms(), explainer=explainer)
    assert verdicts.decisions == ["decline"] * 8
    assert not verdicts.failed and verdicts.reasons == {}


def test_the_shipped_package_explains_with_its_reference_row() -> None:
    package = load_model_package(SHIPPED_MODEL_PATH)
    reference = package.reference
    assert reference is not None and len(reference) == len(package.manifest.features)
    scorer = OnnxScorer(package, "cpu")
    explainer = Explainer(scorer, package.feature_index, reference)
    suspicious = rows(
        [{"log_amount": np.log1p(900.0), "card_tx_1h": np.log1p(6), "terminal_risk_7d": 0.8}]
    )
    (reasons,) = explainer.explain(suspicious, scorer.score(suspicious))
    assert len(reasons) == 3
    assert len({r.text for r in reasons}) == 3
    assert reasons[0].contribution >= reasons[1].contribution >= reasons[2].contribution


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hnp.arrays(
        np.float32,
        (3, NUM_FEATURES),
        elements=st.one_of(
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            st.sampled_from([0.0, 1.0, np.inf, -np.inf, np.nan]),
        ),
    )
)
def test_every_feature_value_gets_a_sentence_and_extreme_rows_get_reasons(
    features: npt.NDArray[np.float32],
) -> None:
    for row in features:
        values = dict(zip(FEATURE_NAMES, row.tolist(), strict=True))
        for feature in CATALOGUE:
            assert isinstance(feature.text(values), str)
    explainer = Explainer(SHIPPED_SCORER, SHIPPED.feature_index, SHIPPED_REFERENCE)
    explained = explainer.explain(features, SHIPPED_SCORER.score(features))
    assert [len(reasons) for reasons in explained] == [3, 3, 3]
    assert all(r.feature in BY_NAME for reasons in explained for r in reasons)


def test_the_time_of_day_is_one_reason_not_two() -> None:
    values = dict.fromkeys(FEATURE_NAMES, 0.0)
    values["hour_sin"], values["hour_cos"] = 1.0, 0.0
    assert (
        BY_NAME["hour_sin"].text(values) == BY_NAME["hour_cos"].text(values) == ("time of day 06h")
    )


def test_a_decline_a_rule_forced_where_the_model_approved_carries_no_model_reasons() -> None:
    scorer = FakeScorer(rule=lambda f: np.full(len(f), 0.1, np.float32))
    explainer = Explainer(
        scorer, np.arange(NUM_FEATURES, dtype=np.intp), np.zeros(NUM_FEATURES, np.float32)
    )
    batch = transactions(4)
    denied = Rules.EMPTY.with_update(f"deny:card:{batch[0].card_id}", b"{}")
    verdicts = decide_batch(batch, scorer, POLICY, now_ms(), rules=denied, explainer=explainer)
    assert verdicts.decisions[0] == "decline" and verdicts.rule_hits[0] == ("deny:card",)
    assert verdicts.reasons == {}, "the rules say why; the model approved"
    assert verdicts.rule_counts == {"deny:card": sum(t.card_id == batch[0].card_id for t in batch)}
