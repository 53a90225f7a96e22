"""The seven fault scenarios. Each runs against the suite's own broker under an open-loop load,
injects its fault, waits for the service to recover, and leaves the checks to
`ScenarioRun.finish()` (the verifier, lag, pauses, memory) plus its own.

1. kill -9 of one of two replicas, several times, each replaced at once;
2. the broker killed with kill -9 mid-stream and restarted after a pause: the replicas must
   ride through (readiness 503 while they cannot deliver, 200 again after, same processes);
3. a zombie: a replica frozen (SIGSTOP) past `max.poll.interval.ms` until the group has moved its
   partitions, then thawed (SIGCONT);
4. a rebalance storm: replicas joining and leaving (SIGTERM) every few seconds;
5. the dead-letter topic deleted mid-stream and created again;
6. a rebalance with held state: a replica holding many cards' state (written to its changelog
   before it starts, `faults/held_state.py`) is joined by a second one, which later leaves
   (SIGTERM); the partitions the first keeps throughout must go on being decided while the
   moved partitions' state is restored in the background (the longest gap between their
   decisions, against `KEPT_GAP_GOAL_MS`), with the latency and the restore times as figures;
7. a rolling upgrade: the first release's worker and replicas, with state, replaced one at a
   time by this tree's (`faults/upgrade.py`).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka.admin import NewTopic

from faults.harness import ADMIN_TIMEOUT_S, ScenarioRun
from faults.held_state import write_held_states
from faults.reading import read_dead_letters
from faults.release import FIRST_RELEASE
from faults.replica_logs import Restore, moved_away, restores, resumes
from faults.replicas import Replica
from faults.timeline import latency, longest_gaps, silences
from faults.timing import Timing
from faults.upgrade import rolling_upgrade
from faults.verifier import Decision, InputRecord
from faults.zombie import Freeze

log = logging.getLogger(__name__)

#: Outputs fail after 3 s and are tried twice, so a replica that cannot deliver turns unready
#: within seconds (the defaults take minutes: 30 s per try, 5 tries).
FAIL_FAST = (
    *("-X", "message.timeout.ms=3000", "--delivery-attempts", "2"),
    *("--retry-backoff-max-ms", "1000"),
)
#: Scenario 3: the group gives a silent member up after 6 s (the least max.poll.interval.ms may
#: be is session.timeout.ms).
ZOMBIE_TIMEOUTS_MS = 6_000
ZOMBIE = (
    *("-X", f"session.timeout.ms={ZOMBIE_TIMEOUTS_MS}"),
    *("-X", f"max.poll.interval.ms={ZOMBIE_TIMEOUTS_MS}"),
)
RECOVERY_TIMEOUT_S = 120.0
#: What a replica logs when its terminal-risk reader gives up (stream/worker_tables.py).
TABLE_STOPPED = "terminal-risk reader stopped"
#: Evidence in a zombie's log that its transaction was fenced and aborted (exactly-once).
FENCING_EVIDENCE = ("aborting", "lost", "fatal transaction error", "fenced")
#: Scenario 6's goal (issue 26): a partition a replica keeps through a rebalance is never longer
#: than this without a decision while the moved partitions' card state is restored.
KEPT_GAP_GOAL_MS = 1_000
#: The card state changelog's settings, as the service creates it (stream/startup/topics.py).
CHANGELOG_CONFIG = {"cleanup.policy": "compact"}


def kill_replicas(run: ScenarioRun, t: Timing) -> None:
    """1. kill -9 one of two replicas, `t.kills` times, alternating; each is replaced at once
    (same instance id: in exactly-once mode the newcomer fences the dead one's transaction)."""
    replicas = {"a": run.replica("a"), "b": run.replica("b")}
    run.wait_assigned(list(replicas.values()))
    run.start_load()
    time.sleep(t.warm_s)
    for i in range(t.kills):
        name = "ab"[i % 2]
        with run.fault(f"kill -9 {name}"):
            replicas[name].kill()
        replicas[name] = run.replica(name)
        waited = run.wait_assigned(list(replicas.values()), RECOVERY_TIMEOUT_S)
        time.sleep(max(0.0, t.kill_every_s - waited))
    time.sleep(t.tail_s)


def kill_broker(run: ScenarioRun, t: Timing) -> None:
    """2. kill -9 the broker, restart it `t.broker_down_s` later; the replicas ride through."""
    replicas = [run.replica("a", *FAIL_FAST), run.replica("b", *FAIL_FAST)]
    run.wait_assigned(replicas)
    pids = {r.name: r.pid for r in replicas}
    run.start_load()
    time.sleep(t.warm_s)
    with run.fault("broker kill -9"):
        killed_ms = time.time_ns() // 1_000_000
        run.broker.kill()
        time.sleep(t.broker_down_s)
        restart_started = time.monotonic()
        run.broker.up()
        restart_s = time.monotonic() - restart_started
        run.admin = run.new_admin()
        back_ms = time.time_ns() // 1_000_000
        ready_s = run.wait_until(_all_ready(run), RECOVERY_TIMEOUT_S, "replicas ready again")
        run.wait_assigned(None, RECOVERY_TIMEOUT_S)
    time.sleep(t.tail_s)
    result = run.result
    result.figures["broker_restart_s"] = f"{restart_s:.1f}"
    result.figures["ready_after_restart_s"] = f"{ready_s:.1f}"
    _check_same_processes(run, pids)
    for name in pids:
        changes = [c for c in run.sampler.peaks.readiness if c[1] == name and c[0] >= killed_ms]
        unready = [
            at for at, _, ready, _ in changes if not ready and at <= back_ms + 1_000 * ready_s
        ]
        result.check(f"{name}: /readyz 503 while it could not deliver", bool(unready), "")
        now = [r.readiness() for r in run.live() if r.name == name]
        since = "; ".join(
            f"{(at - back_ms) / 1000:+.1f}s {'200' if ready else '503'} {why}"
            for at, _, ready, why in changes[-6:]
        )
        result.check(
            f"{name}: /readyz 200 again",
            any(ok for ok, _ in now),
            f"now {now}; changes (s after the restart): {since}",
        )
        # Its terminal-risk reader must outlive the outage too (it once stopped for good).
        stopped = [
            r.name
            for r in run.replicas
            if r.name == name and TABLE_STOPPED in r.log_path.read_text(errors="replace")
        ]
        result.check(f"{name}: terminal-risk reader still reading", not stopped, TABLE_STOPPED)


def zombie(run: ScenarioRun, t: Timing) -> None:
    """3. SIGSTOP a replica past max.poll.interval.ms until the other owns every partition,
    then SIGCONT it."""
    frozen, other = run.replica("zombie", *ZOMBIE), run.replica("b", *ZOMBIE)
    run.wait_assigned([frozen, other])
    run.start_load()
    time.sleep(t.warm_s)
    with run.fault("SIGSTOP zombie"):
        owned = frozenset(run.assignment()[1][frozen.name])
        frozen.signal(signal.SIGSTOP)
        stopped, stopped_ms = time.monotonic(), time.time_ns() // 1_000_000
        try:
            run.wait_assigned([other], RECOVERY_TIMEOUT_S)
            time.sleep(max(0.0, stopped + 1.5 * ZOMBIE_TIMEOUTS_MS / 1000 - time.monotonic()))
        finally:
            frozen.signal(signal.SIGCONT)
        frozen_s = time.monotonic() - stopped
        run.frozen = Freeze(stopped_ms, time.time_ns() // 1_000_000, owned)
        run.wait_assigned([frozen, other], RECOVERY_TIMEOUT_S)
    time.sleep(t.tail_s)
    run.result.figures["frozen_s"] = f"{frozen_s:.1f}"
    if run.settings.exactly_once:
        text = frozen.log_path.read_text(errors="replace")
        found = [e for e in FENCING_EVIDENCE if e in text]
        run.result.check("zombie fenced (its log)", bool(found), f"log shows {found}")


def rebalance_storm(run: ScenarioRun, t: Timing) -> None:
    """4. One replica throughout; others join, or leave (SIGTERM), every `t.storm_every_s`
    for `t.storm_s`: two joins then two leaves, over and over, none waiting for the group to
    settle. Each event's fault lasts until the next one; the last, until the group is stable."""
    base = run.replica("a")
    run.wait_assigned([base])
    run.start_load()
    time.sleep(t.warm_s)
    joined: list[Replica] = []
    exits: list[int] = []
    unclean: list[str] = []  # the end of each leaver's log that exited non-zero: the evidence
    deadline = time.monotonic() + t.storm_s
    settled_s, event, last = 0.0, 0, False
    while not last:
        join = (event % 4 < 2 and len(joined) < 3) or not joined
        next_event = time.monotonic() + t.storm_every_s
        last = next_event >= deadline
        with run.fault(f"{'join' if join else 'leave'} {event}"):
            if join:
                joined.append(run.replica(f"s{event}"))
            else:
                leaver = joined.pop(0)
                code = leaver.stop()
                exits.append(code)
                if code != 0:
                    unclean.append(f"--- {leaver.name} exited {code}:\n{leaver.log_tail(3_000)}")
            time.sleep(max(0.0, next_event - time.monotonic()))
            if last:
                settled_s = run.wait_assigned(None, RECOVERY_TIMEOUT_S)
        event += 1
    time.sleep(t.tail_s)
    run.result.figures["events"] = f"{event}"
    run.result.figures["settled_after_storm_s"] = f"{settled_s:.1f}"
    run.result.check(
        "leavers exited cleanly", not unclean, "\n".join([f"exit codes {exits}", *unclean])
    )


def delete_dlq(run: ScenarioRun, t: Timing) -> None:
    """5. Delete the dead-letter topic mid-stream, create it again `t.dlq_gone_s` later."""
    replicas = [run.replica("a", *FAIL_FAST), run.replica("b", *FAIL_FAST)]
    run.wait_assigned(replicas)
    pids = {r.name: r.pid for r in replicas}
    run.start_load()
    time.sleep(t.warm_s)
    # What the topic holds is destroyed with it: wait until every malformed record sent so far
    # has its dead letter, and keep a copy for the verifier.
    run.load.bad_paused.set()
    run.wait_until(
        lambda: len(read_dead_letters(run.bootstrap, run.dlq_topic)) >= run.load.bad_sent,
        RECOVERY_TIMEOUT_S,
        "dead letters of the malformed records so far",
    )
    run.saved_dead_letters = read_dead_letters(run.bootstrap, run.dlq_topic)
    with run.fault("DLQ deleted"):
        run.admin.delete_topics([run.dlq_topic])[run.dlq_topic].result(timeout=ADMIN_TIMEOUT_S)
        # The controller confirms the deletion before the broker has dropped the partitions: a
        # dead letter written in between is acknowledged and then deleted with the topic (a
        # loss the scenario made, not the service). Malformed records resume once it is gone.
        run.wait_until(
            lambda: run.dlq_topic not in run.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics,
            RECOVERY_TIMEOUT_S,
            "dead-letter topic gone from the broker's metadata",
        )
        run.load.bad_paused.clear()
        time.sleep(t.dlq_gone_s)
        run.wait_until(_recreate(run), RECOVERY_TIMEOUT_S, "dead-letter topic created again")
        run.wait_until(_all_ready(run), RECOVERY_TIMEOUT_S, "replicas ready again")
    time.sleep(t.tail_s)
    run.result.figures["saved_dead_letters"] = f"{len(run.saved_dead_letters)}"
    _check_same_processes(run, pids)


def rebalance_with_held_state(run: ScenarioRun, t: Timing) -> None:
    """6. Replica a starts alone with `t.held_cards` cards' state in its changelog; under load,
    b joins (the partitions it takes are restored on b, in the background; with the settings'
    `state_warm_up`, b reads every partition before joining and then only their tails), stays
    `t.joined_s` and leaves with SIGTERM (a restores them again, in the background, reading
    only what b wrote when it kept their cards). Each fault lasts until the moved partitions
    are resumed. Checked: the longest gap between decisions of each partition a kept
    throughout (never revoked, in its log), against `KEPT_GAP_GOAL_MS`."""
    run.create_topics([run.changelog_topic], CHANGELOG_CONFIG)
    fill_s = write_held_states(
        run.bootstrap, run.changelog_topic, t.held_cards, seed=run.settings.seed
    )
    everything = set(range(run.settings.partitions))
    warm_up = ("--state-warm-up", run.settings.state_warm_up)
    a = run.replica("a", *warm_up)
    run.wait_assigned([a], RECOVERY_TIMEOUT_S)
    run.wait_until(_resumed(a, 0, everything), RECOVERY_TIMEOUT_S, "a's card state restored")
    held_at_start = a.metrics()["fraud_card_state_cards"]
    start_log = _log(a)
    run.start_load()
    time.sleep(t.warm_s)
    with run.fault("b joins"):
        b = run.replica("b", *warm_up)
        run.wait_assigned([a, b], RECOVERY_TIMEOUT_S)
        moved = set(run.assignment()[1][b.name])
        run.wait_until(_resumed(b, 0, moved), RECOVERY_TIMEOUT_S, "b's card state restored")
    time.sleep(t.joined_s)
    b_log, back_at = _log(b), len(_log(a))
    with run.fault("b leaves"):
        exit_code = b.stop()
        run.wait_assigned([a], RECOVERY_TIMEOUT_S)
        run.wait_until(_resumed(a, back_at, moved), RECOVERY_TIMEOUT_S, "a's state back")
    time.sleep(t.tail_s)
    back_log = _log(a)[back_at:]
    figures = run.result.figures
    figures["held_cards"] = f"{t.held_cards}"
    figures["state_warm_up"] = run.settings.state_warm_up
    figures["changelog_fill_s"] = f"{fill_s:.1f}"
    figures["a_cards_at_start"] = f"{held_at_start:.0f}"
    figures["a_cards_at_end"] = f"{a.metrics()['fraud_card_state_cards']:.0f}"
    figures.update(_restore_figures("a_start", start_log))
    figures.update(_restore_figures("b_join", b_log))
    figures.update(_restore_figures("a_back", back_log))
    run.result.check(
        "a restored every held card", held_at_start == t.held_cards, f"{held_at_start:.0f}"
    )
    run.result.check("b left cleanly", exit_code == 0, f"exit code {exit_code}")
    joined, left = run.faults[-2:]
    phases = [
        ("alone", run.load.started_ms),
        ("joining", joined.started_ms),
        ("joined", joined.ended_ms),
        ("leaving", left.started_ms),
        ("after", left.ended_ms),
    ]

    def check_kept(inputs: list[InputRecord], decisions: list[Decision]) -> None:
        restarted = sum(r.name == a.name for r in run.replicas) > 1
        kept = set() if restarted else everything - moved_away(_log(a), run.input_topic)
        gaps = longest_gaps(inputs, decisions, kept)
        worst = max(gaps, key=lambda g: g.waited_ms, default=None)
        late = latency(decisions)
        # When the partitions kept were silent past the goal: a rebalance's doing, or a's
        # alone (a backlog is fetched one partition at a time)?
        silent = silences(inputs, decisions, kept, KEPT_GAP_GOAL_MS)
        figures["kept_silences_over_goal"] = ",".join(
            f"{name}:{sum(_phase(phases, x.from_ms) == name for x in silent)}" for name, _ in phases
        )
        figures["kept_partitions"] = ",".join(str(g.partition) for g in gaps) or "none"
        figures["max_wait_kept_ms"] = f"{worst.waited_ms}" if worst else "?"
        figures["max_gap_kept_ms"] = f"{max((g.decisions_ms for g in gaps), default=0)}"
        figures["max_input_gap_kept_ms"] = f"{max((g.input_ms for g in gaps), default=0)}"
        figures["latency_p50_ms"] = f"{late.p50_ms:.0f}"
        figures["latency_p99_ms"] = f"{late.p99_ms:.0f}"
        figures["latency_max_ms"] = f"{late.max_ms:.0f}"
        if worst is None:
            why = "a was restarted" if restarted else "its log shows every partition revoked"
            run.result.check("a kept partitions throughout", False, why)
            return
        lines = "; ".join(
            f"partition {g.partition}: a record waited {g.waited_ms} ms without a decision; "
            f"longest gap {g.decisions_ms} ms, ended "
            f"{(g.ended_at_ms - run.load.started_ms) / 1000:.1f}s into the load "
            f"(input's longest gap {g.input_ms} ms)"
            for g in gaps
        )
        run.result.check(
            f"kept partitions never left a record {KEPT_GAP_GOAL_MS} ms without a decision",
            worst.waited_ms <= KEPT_GAP_GOAL_MS,
            lines,
        )
        log.info("6 %s: longest gaps of the kept partitions: %s", run.settings.mode, lines)
        for partition in sorted(kept):
            log.info(
                "6 %s: partition %s silent past the goal (ms, from s into the load): %s",
                run.settings.mode,
                partition,
                ", ".join(
                    f"{x.to_ms - x.from_ms} from {(x.from_ms - run.load.started_ms) / 1000:.1f}"
                    f" ({_phase(phases, x.from_ms)})"
                    for x in silent
                    if x.partition == partition
                )
                or "never",
            )

    run.topic_checks.append(check_kept)


def _phase(phases: list[tuple[str, int]], at_ms: int) -> str:
    """The name of the phase (name, start in epoch ms; in order) that `at_ms` falls in."""
    started = [name for name, start in phases if start <= at_ms]
    return started[-1] if started else "before"


def _log(replica: Replica) -> str:
    return replica.log_path.read_text(errors="replace")


def _resumed(replica: Replica, since: int, partitions: set[int]) -> Callable[[], bool]:
    """Every one of `partitions` resumed (its state loaded), in the replica's log past `since`
    characters."""
    return lambda: partitions <= {r.partition for r in resumes(_log(replica)[since:])}


def _restore_figures(name: str, log_text: str) -> dict[str, str]:
    """The restores in a stretch of a replica's log: the longest time from an assignment to
    its partition's resume, the cards restored, the changelog records read, how many restores
    read only the tail over kept cards, and each partition's read (seconds)."""
    done: list[Restore] = restores(log_text)
    waited = max((r.seconds for r in resumes(log_text)), default=0.0)
    return {
        f"{name}_resumed_after_s": f"{waited:.1f}",
        f"{name}_restored_cards": f"{sum(r.cards for r in done)}",
        f"{name}_changelog_records": f"{sum(r.records for r in done)}",
        f"{name}_tail_reads": f"{sum(r.kept for r in done)}",
        f"{name}_reads_s": "[" + ",".join(f"{r.seconds:.1f}" for r in done) + "]",
    }


def _recreate(run: ScenarioRun) -> Callable[[], bool]:
    def create() -> bool:
        topic = NewTopic(run.dlq_topic, run.settings.partitions, 1)
        future = run.admin.create_topics([topic])[run.dlq_topic]
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except Exception as exc:  # still being deleted: try again
            log.info("creating %s again: %s", run.dlq_topic, exc)
            return False
        return True

    return create


def _all_ready(run: ScenarioRun) -> Callable[[], bool]:
    """Every replica the scenario keeps running is alive and ready."""
    return lambda: all(r.alive and r.ready() for r in run.replicas if not r.retired)


def _check_same_processes(run: ScenarioRun, pids: dict[str, int]) -> None:
    """The replicas rode through: the same processes run, none exited or was restarted (but
    for exits on a fatal transaction error, counted in `fatal_exits`)."""
    fatal = set(run.fatal_exits)
    now = {r.name: r.pid for r in run.live() if r.name not in fatal}
    before = {name: pid for name, pid in pids.items() if name not in fatal}
    exits = [
        f"{r.name} exited {r.process.returncode}" for r in run.replicas if r.process and not r.alive
    ]
    run.result.check("replicas rode through (same processes)", now == before, ", ".join(exits))


class Scenario(NamedTuple):
    number: int
    name: str
    run: Callable[[ScenarioRun, Timing], None]


SCENARIOS = {
    s.number: s
    for s in (
        Scenario(1, "kill -9 a replica", kill_replicas),
        Scenario(2, "kill -9 the broker", kill_broker),
        Scenario(3, "zombie (SIGSTOP)", zombie),
        Scenario(4, "rebalance storm", rebalance_storm),
        Scenario(5, "DLQ deleted", delete_dlq),
        Scenario(6, "rebalance with held state", rebalance_with_held_state),
        Scenario(7, f"rolling upgrade from {FIRST_RELEASE}", rolling_upgrade),
    )
}
