"""`make bench`'s settings: defaults, --quick, and refusals that name the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import state_update
from bench.contenders import Run
from bench.pipeline_bench import DEFAULT_BROKER_WARMUP_S, QUICK, build_parser, settings


def _settings(*argv: str) -> Run:
    return settings(build_parser().parse_args(list(argv)), Path("/tmp/scratch"))


def test_the_latency_runs_follow_a_broker_warm_up_unless_it_is_switched_off() -> None:
    assert _settings().broker_warmup_s == DEFAULT_BROKER_WARMUP_S > 0
    assert _settings("--quick").broker_warmup_s == QUICK["broker_warmup"]
    assert _settings("--broker-warmup", "0").broker_warmup_s == 0


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("--broker-warmup", "-1"), "--broker-warmup must be >= 0, got -1"),
        (("--price-per-hour", "-0.5"), "--price-per-hour must be >= 0, got -0.5"),
        (("--window", "0"), "--window must be > 0, got 0"),
        (("--rounds", "0"), "--rounds"),
    ],
)
def test_a_bad_setting_is_refused_by_its_name(argv: tuple[str, ...], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        _settings(*argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--partitions", "0,3"), "partition counts must be >= 1, got '0,3'"),
        (("--partitions", "three"), "expected numbers like 1,3,12, got 'three'"),
        (("--batch", "0"), "must be >= 1, got '0'"),
        (("--rounds", "-2"), "must be >= 1, got '-2'"),
    ],
)
def test_the_state_update_bench_refuses_a_bad_setting_before_it_starts(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        state_update.main(list(argv))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
