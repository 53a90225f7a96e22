"""The checks of the rolling upgrade (fault scenario 7, faults/upgrade.py), once the load is over
and the group drained: features against an unbroken run, what the upgraded worker publishes
against what the history implies, and the rule's hits."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import msgspec
import numpy as np

from contracts.card_frauds import CardFraudsRecord, decode_card_frauds
from contracts.decision import Decision, decode_features
from contracts.terminal_risk import NUM_TERMINAL_FEATURES, decode_terminal_risk
from faults.harness import ScenarioRun
from faults.reading import committed_offsets, end_offsets, read_to_end
from faults.replicas import Replica
from faults.upgrade_history import DAY_MS, RULE_AMOUNT, RULE_HIT, History, alive
from scorer.card_history import NUM_HISTORY_FEATURES
from scorer.features import NUM_TRANSACTION_FEATURES
from scorer.terminal_risk import TerminalRisk, terminal_features

UNBROKEN_TIMEOUT_S = 240.0
#: Columns of a feature row, by kind.
_TERMINAL_START = NUM_TRANSACTION_FEATURES + NUM_HISTORY_FEATURES
_CARD_FRAUDS_START = _TERMINAL_START + NUM_TERMINAL_FEATURES
_Record = TypeVar("_Record")


class _Input(msgspec.Struct):
    transaction_id: str
    card_id: str
    terminal_id: str | None = None
    amount: float = 0.0


def check_upgrade(run: ScenarioRun, history: History, labelled_ms: int, upgraded_ms: int) -> None:
    """The checks of the scenario's docstring, once the load is over and the group drained."""
    result = run.result
    history.wait_counted(labelled_ms)
    _check_card_frauds(run, history)
    _check_terminal_risk(run, history)
    inputs = _inputs(run)
    upgraded = _decisions(run, run.output_topic)
    unbroken = _unbroken_run(run, history)
    late_cards, late_terminals = history.late_cards_and_terminals()
    compared = differing = 0
    after = {"decisions": 0, "card_history": 0, "terminal_risk": 0, "card_frauds": 0}
    examples: list[str] = []
    for transaction_id, decision in upgraded.items():
        seen = inputs.get(transaction_id)
        if seen is None or seen.card_id in late_cards or seen.terminal_id in late_terminals:
            continue
        row = decode_features(decision.features)
        other = unbroken.get(transaction_id)
        compared += 1
        if other is None or not np.array_equal(row, decode_features(other.features)):
            differing += 1
            if len(examples) < 3:
                examples.append(transaction_id)
        if decision.decided_at >= upgraded_ms:
            after["decisions"] += 1
            after["card_history"] += decision.card_id in history.cards
            after["terminal_risk"] += bool(row[_TERMINAL_START:_CARD_FRAUDS_START].any())
            after["card_frauds"] += bool(row[_CARD_FRAUDS_START:].any())
    result.figures["features_compared"] = str(compared)
    result.check(
        "features equal to an unbroken run's",
        compared > 0 and differing == 0,
        f"{differing} of {compared} differ (e.g. {examples})",
    )
    result.figures.update({f"after_upgrade_{k}": str(v) for k, v in after.items()})
    result.check(
        "decisions after the upgrade read state built before it",
        all(after.values()),
        ", ".join(f"{k} {v}" for k, v in after.items()),
    )
    wrong = [
        i
        for i, d in upgraded.items()
        if i in inputs and (RULE_HIT in d.rules) != (inputs[i].amount > RULE_AMOUNT)
    ]
    hits = sum(RULE_HIT in d.rules for d in upgraded.values())
    result.figures["rule_hits"] = str(hits)
    result.check("the rule hit exactly what it matches", hits > 0 and not wrong, f"{wrong[:3]}")


def _check_card_frauds(run: ScenarioRun, history: History) -> None:
    """Every card's published frauds are those of its labels, day by day, each counted once (a
    record lists every day with a fraud, 38 at most: the history spans 12)."""
    expected: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for card, _, day in history.frauds:
        expected[card][day] += 1
    published = _latest(run, history.card_frauds_topic, decode_card_frauds)
    wrong = [
        card
        for card in expected.keys() | published.keys()
        if dict(expected.get(card, {})) != _days(published.get(card))
    ]
    run.result.figures["cards_with_frauds"] = str(len(expected))
    run.result.check(
        "the upgraded worker's card frauds count every label once",
        bool(expected) and not wrong,
        f"{len(wrong)} cards differ, e.g. {wrong[:3]}",
    )


def _days(record: CardFraudsRecord | None) -> dict[int, int]:
    """A published card record's frauds by day (none without a record)."""
    if record is None:
        return {}
    return {int(d): int(f) for d, f in zip(record.days, record.frauds, strict=True)}


def _check_terminal_risk(run: ScenarioRun, history: History) -> None:
    """Every terminal's published risk, as the scorer reads it today, is that of its past
    transactions and of every label, each counted once: a worker that lost what it counted
    before the upgrade, or counted it again, publishes other windows."""
    today = np.array([time.time_ns() // 1_000_000 // DAY_MS], np.int64)
    expected: dict[str, TerminalRisk] = defaultdict(TerminalRisk)
    for terminal, day in history.terminal_days:
        expected[terminal].add_transaction(day)
    for _, terminal, day in history.frauds:
        expected[terminal].add_label(day, fraud=True)
    published = _latest(run, history.risk_topic, decode_terminal_risk)
    wrong = [
        terminal
        for terminal, risk in expected.items()
        if not np.array_equal(
            risk.features(int(today[0])), terminal_features(published, [terminal], today)[0]
        )
    ]
    run.result.figures["terminals_checked"] = str(len(expected))
    run.result.check(
        "the upgraded worker's terminal risk counts every transaction and label once",
        not wrong,
        f"{len(wrong)} terminals differ, e.g. {wrong[:3]}",
    )


def _latest(run: ScenarioRun, topic: str, decode: Callable[[bytes], _Record]) -> dict[str, _Record]:
    """The latest record of each key of a compacted topic (a tombstone removes it)."""
    latest: dict[str, _Record] = {}
    for message in read_to_end(run.bootstrap, topic, 60):
        key, value = (message.key() or b"").decode(), message.value()
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = decode(value)
    return latest


def _inputs(run: ScenarioRun) -> dict[str, _Input]:
    decode = msgspec.json.Decoder(_Input).decode
    found = {}
    for message in read_to_end(run.bootstrap, run.input_topic, 120):
        try:
            record = decode(message.value() or b"")
        except msgspec.MsgspecError:
            continue  # the load's malformed records: dead letters
        found[record.transaction_id] = record
    return found


def _decisions(run: ScenarioRun, topic: str) -> dict[str, Decision]:
    """The first decision of each transaction on `topic`."""
    decode = msgspec.json.Decoder(Decision).decode
    found: dict[str, Decision] = {}
    for message in read_to_end(run.bootstrap, topic, 120):
        decision = decode(message.value() or b"")
        found.setdefault(decision.transaction_id, decision)
    return found


def _unbroken_run(run: ScenarioRun, history: History) -> dict[str, Decision]:
    """This tree's code deciding the whole input from the beginning, in a group of its own."""
    group = f"{run.group}-unbroken"
    output, dlq = f"{run.output_topic}-unbroken", f"{run.dlq_topic}-unbroken"
    changelog = f"{group}-card-state-changelog"
    run.create_topics([output, dlq])
    run.extra_topics += [output, dlq, changelog]
    args = [
        *("--bootstrap-servers", run.bootstrap, "--group-id", group),
        *("--input-topic", run.input_topic, "--output-topic", output, "--dlq-topic", dlq),
        *("--processing-guarantee", run.settings.mode, "--state-changelog-topic", changelog),
        *history.scorer_args(),
    ]
    replica = Replica("unbroken", args, run.log_dir / "unbroken.log").start()
    run.workers.append(replica)
    ends = end_offsets(run.bootstrap, run.input_topic)
    partitions = run.settings.partitions
    run.wait_until(
        lambda: (
            alive([replica])
            and committed_offsets(run.bootstrap, group, run.input_topic, partitions) == ends
        ),
        UNBROKEN_TIMEOUT_S,
        "the unbroken run decided the input",
    )
    replica.stop()
    return _decisions(run, output)
