"""7. A rolling upgrade from a release (`make upgrade-check`): the release's features worker and two
scorer replicas run under load with state of every kind the service keeps, and are replaced one
at a time by this tree's code.

The state, written before the release starts (`History`, faults/upgrade_history.py):
- past transactions (the same simulated cards and terminals as the load's, moved 12 days to 1
  day back) and a label for each card's first fraud: the worker counts them into terminal risk
  and card frauds, and the replicas into their cards' history and its changelog;
- a rule on the rules topic that reviews every transaction over an amount.

Under the load, as docs/upgrading.md says, the readers of the worker's records first: each scorer
replica in turn (SIGTERM, then this tree's replica under the same instance id; exactly-once: the
same transactional id). Then the worker (SIGTERM, then this tree's worker under the same app id,
restoring its tables from the changelogs the release wrote, the card table's copied first); it
is then given the labels of the other frauds of those cards, so that it counts on top of what
it restored.

The checks (faults/upgrade_checks.py), beyond the verifier's (nothing lost; nothing duplicated
under exactly-once):
- every decision's feature row equals an unbroken run's: this tree's code deciding the same
  input from the beginning, in a group of its own, after the scenario, on the topics the workers
  published (the cards and terminals of the labels given during the load are left out of that
  comparison: their features rightly change when those labels are counted);
- the state reached across: of the decisions this tree's replicas made, those of cards with
  history, at terminals with risk, and of cards with confirmed frauds are counted, and each count
  must be above 0, or the comparison would prove nothing;
- what the upgraded worker publishes, as the scorer reads it today, counts every past transaction
  and every label once: each terminal's risk and each card's frauds;
- the rule hit every transaction over its amount, and no other, before and after.
"""

from __future__ import annotations

import time

from faults.harness import ScenarioRun
from faults.timing import Timing
from faults.upgrade_checks import check_upgrade
from faults.upgrade_history import WORKER_READY_TIMEOUT_S, History, alive


def rolling_upgrade(run: ScenarioRun, t: Timing) -> None:
    """7. The release's worker and replicas under load with state, replaced one at a time by
    this tree's code."""
    release = run.settings.release
    if release is None:
        raise RuntimeError("scenario 7 needs a release to upgrade from (--release-root)")
    history = History(run, t.history_records)
    worker = run.worker("w", history.worker_args(str(run.log_dir / "w-release")), release)
    counted_s = history.wait_counted(history.newest_ms)
    run.result.figures["history_counted_s"] = f"{counted_s:.1f}"
    extra = history.scorer_args()
    replicas = {name: run.replica(name, *extra, release=release) for name in "ab"}
    run.wait_assigned(list(replicas.values()))
    run.start_load()
    time.sleep(t.warm_s)
    # The readers of the worker's records first, then the worker (docs/upgrading.md).
    for name in "ab":
        with run.fault(f"{name} upgraded"):
            replicas[name].stop()
            replicas[name] = run.replica(name, *extra)
            run.wait_assigned(list(replicas.values()))
    upgraded_ms = time.time_ns() // 1_000_000
    with run.fault("worker upgraded"):
        worker.stop()
        worker = run.worker("w", history.worker_args(str(run.log_dir / "w-tree")))
        run.wait_until(
            lambda: alive([worker]) and worker.ready(),
            WORKER_READY_TIMEOUT_S,
            "this tree's worker ready",
        )
    labelled_ms = history.give_later_labels()
    time.sleep(t.tail_s)
    run.topic_checks.append(lambda _i, _d: check_upgrade(run, history, labelled_ms, upgraded_ms))
