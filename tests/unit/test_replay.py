"""`fraud-loadgen --replay`: a team's recorded rows read (JSON lines, CSV), mapped, ordered and
paced (loadgen/replay.py); the run itself is in tests/integration/test_loadgen.py."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from contracts.field_mapping import FieldMapping
from loadgen.cli import main
from loadgen.replay import ReplaySchedule, plan, read_rows
from simulator.team_shapes import checkout_event
from simulator.transactions import TransactionSimulator

CHECKOUT = FieldMapping.load(Path(__file__).parents[2] / "examples" / "checkout" / "mapping.toml")
RECORDS = [dict(r) for r in TransactionSimulator(11, id_prefix="rp").generate(20).records]


def test_json_lines_and_csv_read_alike(tmp_path: Path) -> None:
    rows = [{"event_id": "a", "occurred_at": 1.5, "flag": True, "n": 3}]
    jsonl = tmp_path / "day.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    csv_file = tmp_path / "day.csv"
    csv_file.write_text("event_id,occurred_at,flag,n\na,1.5,true,3\n")
    assert read_rows(jsonl) == read_rows(csv_file) == rows


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("day.txt", "", "unknown file type '.txt'"),
        ("day.jsonl", '{"a": 1}\n[1, 2]\n', "line 2: expected a JSON object"),
        ("day.jsonl", "{broken\n", "line 1: not JSON"),
    ],
)
def test_an_unreadable_file_names_the_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_rows(path)


def test_rows_are_mapped_ordered_by_event_time_and_sent_without_their_label() -> None:
    rows = [{**checkout_event(r), "is_fraud": i % 2} for i, r in enumerate(RECORDS)]
    rows.reverse()
    planned = plan(rows, CHECKOUT, "is_fraud")
    times = [row.event_time for row in planned]
    assert times == sorted(times)
    first = planned[0]
    assert first.readable and first.key == str(RECORDS[0]["card_id"]).encode()
    assert first.transaction_id == RECORDS[0]["transaction_id"]
    assert first.is_fraud is False
    assert "is_fraud" not in msgspec.json.decode(first.value)


def test_a_row_the_mapping_cannot_read_is_sent_and_marked() -> None:
    rows = [checkout_event(r) for r in RECORDS[:3]]
    del rows[1]["payment"]
    planned = plan(rows, CHECKOUT, "is_fraud")
    assert [row.readable for row in planned].count(False) == 1
    assert all(row.is_fraud is None for row in planned)
    with pytest.raises(ValueError, match="row 1: is_fraud must be true/false or 1/0"):
        plan([{**rows[0], "is_fraud": "maybe"}], CHECKOUT, "is_fraud")


def test_the_schedule_keeps_the_pace_speeds_it_up_or_sends_at_a_rate() -> None:
    times = [0, 1_000, 1_500, 4_000]
    original = ReplaySchedule(times)
    assert [original.due_at(i) for i in range(4)] == [0.0, 1.0, 1.5, 4.0]
    assert original.due_by(1.2) == 2 and original.due_by(10) == 4
    doubled = ReplaySchedule(times, speed=2.0)
    assert doubled.due_at(3) == 2.0
    constant = ReplaySchedule(times, rate=100.0)
    assert constant.due_at(3) == pytest.approx(0.03) and constant.duration_s == 1.0
    with pytest.raises(ValueError, match="no rows"):
        ReplaySchedule([])


def test_bad_replay_flags_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    day = tmp_path / "day.jsonl"
    day.write_text(json.dumps(RECORDS[0]) + "\n")
    for flags, message in [
        (["--replay-speed", "0"], "--replay-speed must be > 0"),
        (["--replay-rate", "-1"], "--replay-rate must be > 0"),
        (["--input-mapping", str(tmp_path / "none.toml")], "cannot read input mapping"),
    ]:
        assert main(["--replay", str(day), *flags]) == 2
        assert message in capsys.readouterr().err
