"""The pure parts of `fraud-train from-topics` (training/from_topics.py): the split by event time,
the recall at a fixed false-positive rate the models are compared by, the audit sample's
training weights, and the LightGBM fit they go to."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.label_regimes import audit_sample
from training import gbdt
from training.audit import Audit, audit_weights
from training.from_topics import recall_at_fpr, split_by_time
from training.logged_decisions import Decisions
from training.options import parse_args


def test_the_split_is_by_event_time_oldest_first_and_leaves_the_delay_out():
    rng = np.random.default_rng(0)
    event_time = rng.permutation(np.arange(1_000, dtype=np.int64))
    split = split_by_time(
        event_time, until_ms=999, validation_share=0.2, evaluation_share=0.1, delay_ms=100
    )
    kept = 900  # event times 0..899: the last 100 ms before the cut-off are left out
    assert (len(split.train), len(split.validation), len(split.evaluation)) == (630, 180, 90)
    assert event_time[split.train].max() < event_time[split.validation].min()
    assert event_time[split.validation].max() < event_time[split.evaluation].min()
    assert event_time[split.evaluation].max() == kept - 1
    assert len(np.unique(np.concatenate(split))) == kept


def test_recall_at_fpr_counts_the_frauds_above_the_legitimate_quantile():
    legit = np.linspace(0.0, 1.0, 1_001)[:-1]  # 1,000 legitimate scores in [0, 1)
    frauds = np.array([0.5, 0.985, 0.995, 0.9999])
    scores = np.concatenate([legit, frauds])
    is_fraud = np.concatenate([np.zeros(1_000, bool), np.ones(4, bool)])
    # 1 % of legitimate rows are at or above 0.990: two frauds are above that cut.
    assert recall_at_fpr(is_fraud, scores, 0.01) == pytest.approx(0.5)
    assert np.isnan(recall_at_fpr(np.zeros(3, bool), np.ones(3), 0.01))


@pytest.mark.parametrize(
    "flags",
    [
        ["--validation-share", "0.5", "--evaluation-share", "0.45"],
        ["--validation-share", "0", "--evaluation-share", "0.2"],
        ["--delay", "-1"],
        ["--audit-weight", "0"],
        ["--audit-weight", "nan"],
        ["--audit-weight", "inf"],
    ],
)
def test_shares_that_leave_no_training_rows_and_a_negative_delay_are_refused(flags, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["from-topics", "--out", "x", *flags])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "must" in error and "%%" not in error


@pytest.mark.parametrize("share", ["-0.1", "1.5", "nan", "all"])
def test_an_audit_share_outside_zero_to_one_is_refused_by_from_topics(share: str, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["from-topics", "--out", "x", "--audit-share", share])
    assert exit_.value.code == 2
    assert "--audit-share" in capsys.readouterr().err


def test_fraud_train_help_names_every_command_and_each_has_its_own(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    assert "simulator" in (top := capsys.readouterr().out) and "from-topics" in top
    for command, option in (("simulator", "--seeds"), ("from-topics", "--decisions-topic")):
        with pytest.raises(SystemExit):
            parse_args([command, "--help"])
        assert option in capsys.readouterr().out


def test_a_missing_command_is_refused_and_the_old_flag_still_works_with_a_warning(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2 and "COMMAND" in capsys.readouterr().err
    args = parse_args(["--from-topics", "--out", "x"])
    assert args.command == "from-topics" and str(args.out) == "x"
    assert "deprecated: use `fraud-train from-topics`" in capsys.readouterr().err


def test_the_old_flag_is_read_only_where_no_command_comes_first(capsys):
    with pytest.raises(SystemExit):
        parse_args(["simulator", "--from-topics"])
    assert "unrecognized arguments: --from-topics" in capsys.readouterr().err


def _decisions(ids: list[str], approved: np.ndarray) -> Decisions:
    n = len(ids)
    return Decisions(
        ids,
        np.zeros((n, 1), np.float32),
        np.arange(n, dtype=np.int64),
        np.zeros(n, np.float32),
        approved,
        ["v1"] * n,
        {},
    )


def test_an_audited_approved_fraud_weighs_the_audit_weight_and_nothing_else_does():
    ids = [f"tx-{i}" for i in range(20_000)]
    rng = np.random.default_rng(1)
    approved = rng.random(len(ids)) < 0.9
    is_fraud = rng.random(len(ids)) < 0.05
    in_sample = audit_sample(ids, 0.05)

    weight, audit = audit_weights(_decisions(ids, approved), is_fraud, 0.05, 20.0)

    heavy = approved & in_sample & is_fraud
    assert heavy.sum() > 20
    assert (weight[heavy] == 20.0).all() and (weight[~heavy] == 1.0).all()
    assert (audit.audited, audit.frauds) == (int((approved & in_sample).sum()), int(heavy.sum()))
    rate, low, high = audit.approved_fraud_rate()
    assert low < rate < high and abs(rate - 0.05) < 0.02
    weight, audit = audit_weights(_decisions(ids, approved), is_fraud, 0.0, 20.0)
    assert (weight == 1.0).all() and (audit.audited, audit.frauds) == (0, 0)


def test_the_approved_fraud_rates_interval_is_wilsons():
    audit = Audit(0.01, audited=100, frauds=0, weight=1.0)
    assert audit.approved_fraud_rate() == pytest.approx((0.0, 0.0, 0.03699), abs=1e-5)
    rate, low, high = Audit(0.01, 1_000, 50, 1.0).approved_fraud_rate()
    assert (rate, low, high) == pytest.approx((0.05, 0.03813, 0.06531), abs=1e-5)


def test_a_heavier_fraud_row_raises_the_ensembles_score_there():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4_000, 3)).astype(np.float32)
    is_fraud = rng.random(4_000) < 0.02
    x[:40, 0] = 6.0  # a region of its own, one fraud in it
    is_fraud[:40] = False
    is_fraud[0] = True
    weight = np.ones(4_000)
    weight[0] = 200.0
    plain = gbdt.raw_scores(gbdt.fit(x, is_fraud, 7), x[:40]).mean()
    weighted = gbdt.raw_scores(gbdt.fit(x, is_fraud, 7, weight), x[:40]).mean()
    assert weighted > plain + 1.0
