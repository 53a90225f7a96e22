"""Training (training/): replay, protocol, both candidates, export; and the shipped model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightgbm
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from scorer.fallback import CUTOFFS, red_flags
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model_package import CARD_FILE, load_model_package, write_model_package
from simulator.label_regimes import LabelRegime
from simulator.replay import replay_history, simulate
from stream.startup.config import SHIPPED_MODEL_PATH
from training import gbdt, handbook_recipe
from training.calibration import Platt, fit_platt, reliability, sigmoid
from training.candidates import HANDBOOK
from training.card import render_model_card
from training.cold_start_check import COLD_CHECK_DAYS
from training.fallback_fit import fit_fallback
from training.fold_data import (
    COLD_START_DAYS,
    FRESH_LABEL_COLUMNS,
    KNOWN_COMPROMISED_FEATURE,
    stream_fold,
    training_rows,
)
from training.onnx_export import IR_VERSION, OPSET, score_with_onnxruntime
from training.protocol import (
    DELAY_DAYS,
    TEST_DAYS,
    TRAIN_DAYS,
    average_precision,
    card_precision_at_k,
    days_needed,
    fold_schedule,
    handbook_fold,
    roc_auc,
)
from training.results import TrainingResult, mean_std, spread
from training.shipped_package import manifest
from training.simulator_run import main
from training.thresholds import Chosen, decline_threshold, flagged_shares, review_threshold
from training.train import train_model

#: The reduced configuration: 600 customers, the shortest stream that holds one validation and
#: one test fold.
SMALL: dict[str, Any] = {
    "seed": 3,
    "days": days_needed(1),
    "folds": 1,
    "cards": 600,
    "without_fresh_labels": True,
    "regime": LabelRegime.CAPACITY,
}
#: Operators with CUDA kernels in ONNX Runtime that the exported graphs may use.
CUDA_OPS = {
    "Gemm",
    "MatMul",
    "Add",
    "Relu",
    "Sigmoid",
    "Reshape",
    "Gather",
    "GatherElements",
    "Greater",
    "Cast",
    "Transpose",
    "Equal",
    "ReduceSum",
    "Concat",
    "Slice",
}


@pytest.fixture(scope="module")
def small() -> TrainingResult:
    return train_model(**SMALL)


def test_reduced_run_chooses_on_validation_and_tests_only_the_choice(
    small: TrainingResult,
) -> None:
    assert set(small.validation) == {"gbdt", "mlp", HANDBOOK}
    best = max(("gbdt", "mlp"), key=lambda k: mean_std(small.validation[k], "average_precision")[0])
    assert small.winner == best
    assert set(small.test) == {small.winner, HANDBOOK}, "the other candidate is never tested"
    for results in (*small.validation.values(), *small.test.values()):
        (fold,) = results
        assert 0.5 < fold.handbook.roc_auc <= 1.0
        assert 0.0 < fold.handbook.average_precision <= 1.0
    (validation,), (test,) = small.schedule
    assert validation + TRAIN_DAYS + DELAY_DAYS + TEST_DAYS <= test + TRAIN_DAYS + DELAY_DAYS
    model = onnx.load_from_string(small.model)
    onnx.checker.check_model(model)
    assert model.ir_version == IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert {node.op_type for node in model.graph.node} <= CUDA_OPS
    metadata = {p.key: p.value for p in model.metadata_props}
    assert metadata["feature_names"] == ",".join(FEATURE_NAMES)
    assert metadata["model_version"] == small.model_version


def test_reduced_run_calibrates_and_chooses_thresholds_on_validation(
    small: TrainingResult,
) -> None:
    assert small.platt.a > 0.0
    assert 0.0 < small.thresholds.review <= small.thresholds.decline < 1.0
    legit_review, _ = small.validation_outcomes["legit"]
    assert legit_review <= 0.01, "the review goal holds where it was chosen"
    rows = sum(b.rows for b in small.test_reliability)
    frauds = sum(b.frauds for b in small.test_reliability)
    assert rows > 0 and frauds / rows == pytest.approx(small.test_fraud_rate)
    assert set(small.test_at_review) == {small.winner, HANDBOOK}
    ours = small.test_at_review[small.winner]
    assert ours.threshold == small.thresholds.review
    assert ours.legit_share == pytest.approx(small.test_outcomes["legit"][0])
    # On the test weeks a threshold need not flag the share it was chosen for on the validation
    # weeks: in this 600-card world, 18 % of legitimate rows reach our review threshold.
    recipe = small.test_at_review[HANDBOOK]
    for at in (ours, recipe):
        assert 0.0 < at.fraud_recall <= 1.0 and 0.0 <= at.legit_share <= 1.0
    written = manifest(small)
    assert written.output.calibration == "platt"
    assert (written.thresholds.review, written.thresholds.decline) == small.thresholds


def test_the_card_describes_the_compiled_trees(small: TrainingResult) -> None:
    card = render_model_card([small], {LabelRegime.CAPACITY: [small]})
    recipe_line = next(line for line in card.splitlines() if line.startswith("| capacity | hand"))
    recall = small.test_at_review[HANDBOOK].fraud_recall
    assert f"| {recall:.3f} |" in recipe_line, "the recipe's recall at its own review threshold"
    if small.winner == "gbdt":
        shape = gbdt.graph_shape(small.model)
        assert shape.trees == gbdt.NUM_TREES
        assert 1 <= shape.depth <= gbdt.PARAMS["max_depth"]
        assert f"each of the {shape.splits} distinct splits" in card
        assert f"One call runs {shape.nodes} operators" in card
    else:
        assert "## Scoring cost" not in card
    assert "not comparable" in card and "± 0.01 |" not in card.split("published")[0]
    (ablated,) = small.without_fresh_labels
    assert f"without {', '.join(f'`{c}`' for c in FRESH_LABEL_COLUMNS)}" in card
    assert 0.5 < ablated.handbook.roc_auc <= 1.0


def test_training_is_deterministic(small: TrainingResult) -> None:
    again = train_model(**SMALL)
    assert again.model == small.model
    assert render_model_card([again], {small.regime: [again]}) == render_model_card(
        [small], {small.regime: [small]}
    )


def test_compiled_trees_score_exactly_as_lightgbm() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(3_000, NUM_FEATURES)).astype(np.float32)
    features[:, 3] = np.round(features[:, 3], 1)  # values on the thresholds
    labels = features[:, 0] + features[:, 3] * features[:, 5] > 0.5
    # Binned as the shipped trees are: 4,095 bins put thresholds between close values.
    data = lightgbm.Dataset(features, labels.astype(float), params=gbdt.DATASET_PARAMS)
    booster = lightgbm.train({**gbdt.PARAMS, "seed": 1}, data, 40)
    trees = gbdt.compile_trees(booster.dump_model())
    expected = np.asarray(booster.predict(features, raw_score=True))
    assert np.allclose(gbdt.raw_scores(trees, features), expected, atol=1e-4)
    model = gbdt.export_onnx(trees, NUM_FEATURES, "t", {"model_version": "t"})
    scores = score_with_onnxruntime(model, features)
    assert np.allclose(scores, 1.0 / (1.0 + np.exp(-expected)), atol=1e-5)
    assert score_with_onnxruntime(model, features[:0]).shape == (0,)
    assert score_with_onnxruntime(model, features[:1]).shape == (1,)


def test_unbalanced_and_single_leaf_trees_are_padded_to_the_same_scores() -> None:
    rng = np.random.default_rng(1)
    features = rng.normal(size=(2_000, NUM_FEATURES)).astype(np.float32)
    labels = features[:, 0] * features[:, 1] + features[:, 2] > 0.8
    # Leaf-wise growth without a depth limit: trees of 1 to 7 levels, leaves at every depth.
    params = {**gbdt.PARAMS, "num_leaves": 8, "max_depth": -1, "seed": 2}
    booster = lightgbm.train(params, lightgbm.Dataset(features, labels.astype(float)), 20)
    dump = booster.dump_model()
    stump = {"tree_structure": {"leaf_value": 0.25}}  # a tree that never split
    dump["tree_info"].append(stump)
    trees = gbdt.compile_trees(dump)
    assert trees.depth > 3
    expected = np.asarray(booster.predict(features, raw_score=True)) + 0.25
    assert np.allclose(gbdt.raw_scores(trees, features), expected, atol=1e-4)
    model = gbdt.export_onnx(trees, NUM_FEATURES, "t", {"model_version": "t"})
    scores = score_with_onnxruntime(model, features)
    assert np.allclose(scores, 1.0 / (1.0 + np.exp(-expected)), atol=1e-5)
    calibrated = gbdt.calibrated(trees, 0.5, -1.5)
    assert np.allclose(gbdt.raw_scores(calibrated, features), 0.5 * expected - 1.5, atol=1e-4)


def test_an_ensemble_of_stumps_or_too_deep_trees() -> None:
    stumps = gbdt.compile_trees({"tree_info": [{"tree_structure": {"leaf_value": -0.5}}] * 2})
    assert stumps.depth == 1
    rows = np.zeros((3, NUM_FEATURES), np.float32)
    assert np.allclose(gbdt.raw_scores(stumps, rows), -1.0)
    model = gbdt.export_onnx(stumps, NUM_FEATURES, "t", {"model_version": "t"})
    assert np.allclose(score_with_onnxruntime(model, rows), 1.0 / (1.0 + np.exp(1.0)))
    node: dict[str, object] = {"leaf_value": 0.0}
    for _ in range(gbdt.MAX_DEPTH + 1):
        node = {"split_feature": 0, "threshold": 0.5, "left_child": node, "right_child": node}
    with pytest.raises(ValueError, match="levels deep"):
        gbdt.compile_trees({"tree_info": [{"tree_structure": node}]})


def test_replay_uses_the_service_code_whatever_the_batch_size() -> None:
    stream = simulate(seed=4, days=3, cards=200)
    assert stream.features.shape == (len(stream.is_fraud), NUM_FEATURES)
    assert np.isfinite(stream.features).all()
    assert np.array_equal(replay_history(stream.columns, 1), replay_history(stream.columns, 256))


def test_handbook_fold_removes_known_compromised_cards() -> None:
    day = np.repeat(np.arange(21), 3)
    card = np.tile(np.array([1, 2, 3]), 21)
    is_fraud = np.zeros(len(day), bool)
    is_fraud[(day == 2) & (card == 1)] = True  # known from the training week
    is_fraud[(day == 9) & (card == 2)] = True  # known from the fourth test day (day 17) on
    fold = handbook_fold(day, card, is_fraud, 0)
    assert set(day[fold.train].tolist()) == set(range(7))
    tested = {(int(d), int(c)) for d, c in zip(day[fold.test], card[fold.test], strict=True)}
    assert all(c != 1 for _, c in tested)
    assert (14, 2) in tested and (16, 2) in tested and (17, 2) not in tested


def test_a_fold_also_removes_the_rows_a_mask_marks_known() -> None:
    day = np.repeat(np.arange(21), 3)
    card = np.tile(np.array([1, 2, 3]), 21)
    is_fraud = np.zeros(len(day), bool)
    known_at_row = (card == 3) & (day >= 15)  # card 3 reported compromised during day 14
    plain = handbook_fold(day, card, is_fraud, 0)
    served = handbook_fold(day, card, is_fraud, 0, known_at_row)
    assert np.array_equal(served.train, plain.train)
    assert set(served.test.tolist()) == set(plain.test.tolist()) - set(
        np.flatnonzero(known_at_row).tolist()
    )
    assert {(int(d), int(c)) for d, c in zip(day[served.test], card[served.test], strict=True)} >= {
        (14, 3)
    }


def test_a_spread_is_the_sample_standard_deviation() -> None:
    assert spread([0.80, 0.82, 0.84]) == pytest.approx((0.82, 0.02))
    mean, std = spread([0.5])
    assert mean == 0.5 and np.isnan(std)


def test_card_precision_at_k_known_values() -> None:
    day = np.array([0, 0, 0, 0, 1, 1, 1])
    card = np.array([1, 1, 2, 3, 1, 2, 3])
    is_fraud = np.array([False, True, False, False, False, True, False])
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.9, 0.7, 0.1])
    # Day 0: top 2 cards 1 (0.9) and 2 (0.8), card 1 had a fraud: 1/2. Day 1: card 1 is
    # caught already; top 2 of cards 2 and 3: card 2 fraud: 1/2.
    assert card_precision_at_k(day, card, is_fraud, scores, k=2) == pytest.approx(0.5)


def test_roc_auc_against_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.2
    scores = np.round(rng.random(300), 1)  # many ties
    pairs = scores[labels][:, None] - scores[~labels][None, :]
    expected = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
    assert roc_auc(labels, scores) == pytest.approx(expected)
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.array([True, True]), np.array([0.1, 0.9]))


def test_average_precision_known_values() -> None:
    labels = np.array([True, False, True, False])
    assert average_precision(labels, np.array([0.9, 0.8, 0.7, 0.1])) == pytest.approx(5 / 6)
    assert average_precision(labels, np.full(4, 0.5)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="fraud"):
        average_precision(np.zeros(3, bool), np.zeros(3))


def test_a_training_run_writes_a_package_the_service_reads(
    small: TrainingResult, tmp_path: Path
) -> None:
    package = write_model_package(tmp_path / "p", small.model, manifest(small), "card")
    again = load_model_package(tmp_path / "p")
    assert again.manifest == package.manifest
    assert again.version == small.model_version
    assert again.manifest.features == list(FEATURE_NAMES)
    legit = small.reference
    assert len(legit) == NUM_FEATURES and all(np.isfinite(legit))
    assert (tmp_path / "p" / CARD_FILE).read_text(encoding="utf-8") == "card"


@pytest.mark.parametrize(
    "args",
    [
        ["--seeds", "9", "--days", str(days_needed(1) - 1), "--folds", "1"],
        ["--seeds", "9", "--folds", "0"],
        ["--seeds", "7,7"],
        ["--seeds", "7,x"],
        ["--regimes", "capacity,weekly"],
        ["--regimes", "today,today"],
        ["--audit-share", "1.5"],
        ["--audit-share", "some"],
    ],
)
def test_main_refuses_what_cannot_run(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "package"
    with pytest.raises(SystemExit):
        main([*args, "--out", str(out)])
    assert not out.exists()


def test_validation_folds_precede_every_test_week() -> None:
    schedule = fold_schedule(122, 4)
    assert schedule.test == [101, 94, 87, 80] and schedule.validation == [66, 59, 52, 45]
    last_validation_day = schedule.validation[0] + TRAIN_DAYS + DELAY_DAYS + TEST_DAYS - 1
    assert last_validation_day < min(schedule.test) + TRAIN_DAYS + DELAY_DAYS
    assert fold_schedule(days_needed(4), 4).validation[-1] == 0
    with pytest.raises(ValueError, match="at least 77 days"):
        fold_schedule(76, 4)


def test_platt_scaling_recovers_a_known_map() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(0.0, 3.0, 200_000)
    is_fraud = rng.random(len(logits)) < sigmoid(0.6 * logits - 2.0)
    platt = fit_platt(logits, is_fraud)
    assert platt.a == pytest.approx(0.6, abs=0.02) and platt.b == pytest.approx(-2.0, abs=0.03)
    assert np.allclose(Platt(1.0, 0.0).apply(np.array([0.0, 50.0, -50.0])), [0.5, 1.0, 0.0])
    with pytest.raises(ValueError, match="needs frauds"):
        fit_platt(logits[:10], np.zeros(10, bool))


def test_reliability_bins_count_every_row_once() -> None:
    scores = np.array([0.0, 0.004, 0.5, 0.7, 1.0])
    is_fraud = np.array([False, False, True, False, True])
    bins = reliability(scores, is_fraud, (0.0, 0.01, 0.5, 1.0))
    assert [b.rows for b in bins] == [2, 0, 3]
    assert bins[2].frauds == 2 and bins[2].fraud_rate == pytest.approx(2 / 3)
    assert bins[2].mean_score == pytest.approx(0.7333333)
    assert np.isnan(bins[1].mean_score)


def test_thresholds_meet_their_goals() -> None:
    legit = np.linspace(0.0, 0.5, 1_001)  # 0.0005 apart
    review = review_threshold(legit, 0.01)
    assert (legit >= review).mean() <= 0.01 < (legit >= review - 1e-4).mean()
    scores = np.array([0.1, 0.3, 0.6, 0.9, 0.95])
    is_fraud = np.array([False, True, False, True, True])
    amount = np.array([10.0, 30.0, 10.0, 500.0, 20.0])
    # Declining from just above 0.1 costs one false decline; from just above 0.6, the fraud of
    # 30 it lets through: the cheaper wins, the lowest such threshold.
    assert decline_threshold(scores, is_fraud, amount, 25.0) == pytest.approx(0.1001)
    assert decline_threshold(scores, is_fraud, amount, 40.0) == pytest.approx(0.6001)
    assert decline_threshold(scores, is_fraud, amount, 40.0, floor=0.92) == pytest.approx(0.92)
    assert flagged_shares(scores, Chosen(0.3, 0.9)) == (0.8, 0.4)


def test_the_handbook_recipe_reads_its_fifteen_columns() -> None:
    assert len(handbook_recipe.FEATURES) == len(set(handbook_recipe.COLUMNS.tolist())) == 15
    assert handbook_recipe.FEATURES[0] == ("TX_AMOUNT", "log_amount")
    assert ("TERMINAL_ID_RISK_30DAY_WINDOW", "terminal_risk_30d") in handbook_recipe.FEATURES
    rng = np.random.default_rng(2)
    features = rng.normal(size=(2_000, NUM_FEATURES)).astype(np.float32)
    is_fraud = features[:, FEATURE_NAMES.index("terminal_risk_7d")] > 1.0
    features[:, FEATURE_NAMES.index("card_testing_velocity")] = is_fraud  # not a handbook column
    model = handbook_recipe.fit(features, is_fraud)
    assert roc_auc(is_fraud, handbook_recipe.scores(model, features)) > 0.99


def test_the_fallback_fit_finds_the_flags_that_carry_fraud() -> None:
    rng = np.random.default_rng(3)
    features = np.zeros((50_000, NUM_FEATURES), np.float32)
    amount = rng.uniform(1.0, 400.0, len(features))
    features[:, FEATURE_NAMES.index("log_amount")] = np.log1p(amount)
    risk = rng.random(len(features)) < 0.01
    features[:, FEATURE_NAMES.index("terminal_fresh_frauds_7d")] = np.where(risk, np.log1p(3), 0)
    is_fraud = (amount > 250.0) | (risk & (rng.random(len(features)) < 0.5))
    fit = fit_fallback(features, is_fraud)
    assert fit.cutoffs.large_amount == 250.0 and fit.cutoffs.terminal_recent_frauds <= 3
    assert fit.weights["large_amount"] > 5.0 and fit.weights["terminal_recent_frauds"] > 3.0
    assert abs(fit.weights["card_testing_burst"]) < 0.5, "a flag never raised stays near 0"
    assert set(fit.weights) == set(red_flags(features[:1], CUTOFFS))


def test_shipped_package_matches_features_card_and_cuda_operators() -> None:
    package = load_model_package(SHIPPED_MODEL_PATH)
    model = onnx.load_from_string(package.onnx)
    assert {node.op_type for node in model.graph.node} <= CUDA_OPS
    assert len(package.onnx) < 2_000_000
    session = ort.InferenceSession(package.onnx, providers=["CPUExecutionProvider"])
    metadata = session.get_modelmeta().custom_metadata_map
    assert tuple(metadata["feature_names"].split(",")) == FEATURE_NAMES
    assert package.manifest.features == list(FEATURE_NAMES)
    assert metadata["model_version"] == package.version
    assert package.version in (SHIPPED_MODEL_PATH / CARD_FILE).read_text(encoding="utf-8")


def test_shipped_model_ranks_a_fresh_stream() -> None:
    stream = simulate(seed=2024, days=30)
    recent = stream.day >= 23
    package = load_model_package(SHIPPED_MODEL_PATH)
    scores = score_with_onnxruntime(package.onnx, stream.features[recent])
    assert roc_auc(stream.is_fraud[recent], scores) > 0.85


def test_a_streams_fold_leaves_out_the_rows_whose_card_serving_knows_is_compromised() -> None:
    stream = simulate(seed=5, days=TRAIN_DAYS + DELAY_DAYS + TEST_DAYS, cards=300)
    known = stream.features[:, FEATURE_NAMES.index(KNOWN_COMPROMISED_FEATURE)] > 0
    assessed = np.flatnonzero(stream.day >= TRAIN_DAYS + DELAY_DAYS)
    assert known[assessed].any(), "the stream has rows of cards known to be compromised"
    fold = stream_fold(stream, 0)
    plain = handbook_fold(stream.day, stream.card, stream.is_fraud, 0)
    assert not known[fold.test].any()
    assert set(fold.test.tolist()) == set(plain.test[~known[plain.test]].tolist())


def test_every_fold_also_trains_on_the_cold_start_days(small: TrainingResult) -> None:
    stream = simulate(seed=4, days=COLD_START_DAYS + 3, cards=200)
    week = np.flatnonzero(stream.day >= COLD_START_DAYS - 2)
    rows = training_rows(stream, week)
    cold = np.flatnonzero(stream.day < COLD_START_DAYS)
    assert np.array_equal(rows, np.union1d(cold, week))  # each row once, in stream order
    assert len(small.cold_start) == COLD_CHECK_DAYS
    for day in small.cold_start:
        assert 0.0 <= day.legit_decline <= day.legit_review <= 1.0
