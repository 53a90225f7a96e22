"""One scenario run: its topics, replicas, load and faults, and the checks once it is over.

`ScenarioRun` owns everything a scenario starts and tears it all down, whatever happens. A
scenario starts replicas and the load, marks each fault with `fault()` (the group's committed
offsets are sampled as it begins), and calls `finish()`, which stops the load, waits until the
group has committed everything, checks the live replicas' own view (nothing paused, lag 0), and
runs the verifier over the topics. Every check lands in the `Result` (`faults/results.py`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.client import HTTPException
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from faults.broker import Broker
from faults.load import OpenLoopLoad
from faults.reading import (
    VisibilityLog,
    committed_offsets,
    end_offsets,
    read_dead_letters,
    read_decisions,
    read_inputs,
)
from faults.release import Release
from faults.replicas import Replica, Sampler, lag_samples
from faults.results import Result, Settings
from faults.verifier import DeadLetter, Decision, FaultWindow, InputRecord, verify
from faults.zombie import Freeze
from plumbing.metrics_text import by_key

log = logging.getLogger(__name__)

#: How long the group may take to commit everything once the load stops.
DRAIN_TIMEOUT_S = 180.0
#: How long a replica may take to report no paused partition and zero lag once drained
#: (its lag gauge follows librdkafka's statistics, emitted every second).
SETTLE_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0
POLL_S = 0.2
#: Largest record the load sends (key and value): a transaction's JSON is about 200 bytes.
LOAD_RECORD_MAX_BYTES = 400


class ScenarioRun:
    """Topics, group, replicas, load and faults of one scenario in one mode."""

    def __init__(
        self,
        broker: Broker,
        scenario: str,
        settings: Settings,
        log_dir: Path,
        *,
        keep_topics: bool = False,
    ) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.broker = broker
        self.settings = settings
        self.bootstrap = broker.bootstrap
        self.input_topic = f"faults-tx-{suffix}"
        self.output_topic = f"faults-decisions-{suffix}"
        self.dlq_topic = f"faults-tx-{suffix}.dlq"
        self.group = f"faults-{suffix}"
        #: The replicas' card state changelog (they create it unless a scenario did).
        self.changelog_topic = f"{self.group}-card-state-changelog"
        self.log_dir = log_dir / f"{scenario}-{settings.mode}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.result = Result(scenario, settings.mode)
        self.replicas: list[Replica] = []
        #: Features workers (`python -m terminals run`): not members of the group, not sampled.
        self.workers: list[Replica] = []
        #: Topics a scenario made beyond the three above: deleted with them.
        self.extra_topics: list[str] = []
        self.faults: list[FaultWindow] = []
        #: Dead letters a scenario saved before destroying them (scenario 5 deletes the topic).
        self.saved_dead_letters: list[DeadLetter] = []
        #: Scenario 3: when the zombie was frozen and thawed, and what it owned.
        self.frozen: Freeze | None = None
        #: A scenario's own checks of the topics, run by `finish()` after the verifier with the
        #: input records and the decisions it read.
        self.topic_checks: list[Callable[[list[InputRecord], list[Decision]], None]] = []
        #: Exactly-once replicas that exited 1 on a fatal transaction error and were restarted:
        #: what the service must do then (fenced, or a transaction the broker refuses to end),
        #: so counted (`fatal_exits`), not failed.
        self.fatal_exits: list[str] = []
        self.admin = self.new_admin()
        self.load = OpenLoopLoad(
            self.bootstrap, self.input_topic, settings.rate, seed=settings.seed
        )
        self.sampler = Sampler(self.replicas)
        self._visibility: VisibilityLog | None = None
        self._keep_topics = keep_topics
        self._started = time.monotonic()

    # -- set-up and tear-down ---------------------------------------------------------------

    def __enter__(self) -> ScenarioRun:
        self.create_topics([self.input_topic, self.output_topic, self.dlq_topic])
        self._visibility = VisibilityLog(self.bootstrap, self.output_topic)
        self._visibility.start()
        self.sampler.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        for replica in [*self.replicas, *self.workers]:
            if replica.alive:
                replica.signal(signal.SIGCONT)
                replica.kill()
        if self.load.is_alive():
            self.load.stop()
        self.sampler.stop()
        if self._visibility is not None and self._visibility.is_alive():
            self._visibility.stop()
        self.result.seconds = time.monotonic() - self._started
        if self._keep_topics:
            log.info(
                "keeping %s, %s, %s and %s",
                *(self.input_topic, self.output_topic, self.dlq_topic, self.changelog_topic),
            )
            return
        try:
            existing = self.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
            topics = [self.input_topic, self.output_topic, self.dlq_topic, self.changelog_topic]
            topics = [t for t in [*topics, *self.extra_topics] if t in existing]
            for future in self.admin.delete_topics(topics).values():
                future.result(timeout=ADMIN_TIMEOUT_S)
        except Exception as exc:  # the broker may be the thing that broke
            log.warning("could not delete the scenario's topics: %s", exc)

    def new_admin(self) -> AdminClient:
        """An admin client (a fresh one after a broker restart: librdkafka may keep the old
        broker's coordinators)."""
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topics(self, names: list[str], config: dict[str, str] | None = None) -> None:
        """Create topics (`config`: their topic settings) and wait until the broker's metadata
        lists all their partitions."""
        topics = [NewTopic(n, self.settings.partitions, 1, config=config or {}) for n in names]
        for future in self.admin.create_topics(topics).values():
            future.result(timeout=ADMIN_TIMEOUT_S)

        def listed() -> bool:
            found = self.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
            return all(
                n in found
                and found[n].error is None
                and len(found[n].partitions) == self.settings.partitions
                for n in names
            )

        self.wait_until(listed, ADMIN_TIMEOUT_S, f"topics {names} created")

    # -- replicas and load ------------------------------------------------------------------

    def replica(self, name: str, *extra: str, release: Release | None = None) -> Replica:
        """Start a replica of the scenario's group (`extra`: more `fraud-scorer run` flags),
        of this tree's code or of `release`'s."""
        s = self.settings
        args = [
            *("--bootstrap-servers", self.bootstrap, "--group-id", self.group),
            *("--input-topic", self.input_topic, "--output-topic", self.output_topic),
            *("--dlq-topic", self.dlq_topic, "--processing-guarantee", s.mode),
            *("--state-changelog-topic", self.changelog_topic),
            *("--max-batch-size", str(s.max_batch_size)),
            *("--max-in-flight-records", str(s.max_in_flight_records)),
            *("--max-in-flight-bytes", str(s.max_in_flight_bytes)),
            *extra,
        ]
        replica = Replica(name, args, self.log_dir / f"{name}.log", **_code_of(release)).start()
        self.replicas.append(replica)
        return replica

    def worker(self, name: str, args: list[str], release: Release | None = None) -> Replica:
        """Start a features worker (`fraud-features run` with `args`), of this tree's code or
        of `release`'s."""
        path = self.log_dir / f"{name}.log"
        worker = Replica(name, args, path, module="terminals", **_code_of(release)).start()
        self.workers.append(worker)
        return worker

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Poll `condition` until it holds; return the seconds it took. TimeoutError names
        `what`."""
        started = time.monotonic()
        while not _holds(condition):
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")
            self.restart_stuck()
            time.sleep(POLL_S)
        return time.monotonic() - started

    def restart_stuck(self) -> None:
        """Do what Kubernetes does with a replica whose stream loop is stuck (/healthz 503, the
        liveness probe) or that exited on its own (restartPolicy): start it again, same
        instance id. Each restart fails the scenario (the service must recover without one),
        but for an exactly-once replica's exit on a fatal transaction error (`fatal_exits`);
        the verifier still shows what it cost. A frozen replica (scenario 3) answers nothing
        and is left alone."""
        for replica in list(self.replicas):
            if replica.retired:
                continue
            if replica.alive:
                try:
                    if replica.healthy():
                        continue
                except (OSError, HTTPException):
                    continue
                why = "/healthz 503 (stream loop silent): killed and restarted"
                replica.kill()
            else:
                assert replica.process is not None
                why = f"exited with {replica.process.returncode} on its own: restarted"
            replica.retired = True
            log.error("%s %s: %s %s", self.result.scenario, self.result.mode, replica.name, why)
            self.replicas.append(replica.again().start())
            if self.settings.exactly_once and _exited_on_fatal_error(replica):
                self.fatal_exits.append(replica.name)
                self.result.figures["fatal_exits"] = str(len(self.fatal_exits))
                continue
            self.result.check(f"{replica.name}: needs no restart", False, why)

    def wait_assigned(
        self, replicas: list[Replica] | None = None, timeout_s: float = 90.0
    ) -> float:
        """Until the group is stable with exactly `replicas` as members (the dead and the frozen
        evicted), each owning input partitions, together all of them. A replica counts by its
        name, so one restarted in its place counts too; None: every replica the scenario keeps
        running, as it is at each look."""
        seen = ["nothing yet"]

        def names() -> set[str]:
            chosen = replicas if replicas is not None else self.replicas
            return {r.name for r in chosen if replicas is not None or not r.retired}

        def covered() -> bool:
            try:
                state, owners = self.assignment()
            except Exception as exc:
                seen[0] = f"describe failed: {exc}"
                raise
            seen[0] = f"{state}: " + ", ".join(f"{n} {sorted(p)}" for n, p in owners.items())
            wanted = names()
            owned = [partitions for name, partitions in owners.items() if name in wanted]
            return (
                state == ConsumerGroupState.STABLE
                and len(owners) == len(owned) == len(wanted)
                and all(owned)
                and set().union(*owned) == set(range(self.settings.partitions))
            )

        try:
            return self.wait_until(covered, timeout_s, f"{sorted(names())} assigned")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the group: {seen[0]}") from None

    def assignment(self) -> tuple[ConsumerGroupState, dict[str, set[int]]]:
        """The group's state, and the input partitions each member (by replica name) owns."""
        group = self.admin.describe_consumer_groups([self.group])[self.group].result(
            timeout=ADMIN_TIMEOUT_S
        )
        return group.state, {
            m.client_id.removeprefix(self.group + "-"): {
                tp.partition for tp in m.assignment.topic_partitions
            }
            for m in group.members
        }

    def start_load(self) -> None:
        self.load.start()

    # -- faults -----------------------------------------------------------------------------

    def committed(self) -> dict[int, int]:
        return committed_offsets(
            self.bootstrap, self.group, self.input_topic, self.settings.partitions
        )

    @contextmanager
    def fault(self, name: str) -> Iterator[None]:
        """Mark a fault: the group's committed offsets are sampled just before the body injects
        it; it ends when the body returns (the body waits for what ends the fault)."""
        committed = self.committed()
        started_ms = _now_ms()
        log.info("%s: fault %s", self.result.scenario, name)
        try:
            yield
        finally:
            self.faults.append(FaultWindow(name, started_ms, _now_ms(), committed))

    # -- the end ----------------------------------------------------------------------------

    def finish(self) -> Result:
        """Stop the load, wait for the group to commit everything, check the replicas and the
        topics; return the result."""
        result = self.result
        if self.load.is_alive():
            self.load.stop()
        result.figures["sent"] = f"{self.load.sent}"
        result.figures["sender_lag_s"] = f"{self.load.worst_lag_s:.2f}"
        result.check("load delivered", self.load.failed == 0, f"{self.load.failed} not acked")
        ends = end_offsets(self.bootstrap, self.input_topic)
        try:
            drain_s = self.wait_until(
                lambda: self.committed() == ends, DRAIN_TIMEOUT_S, "group committed the input"
            )
            result.check("lag returns to 0 (group committed)", True, f"in {drain_s:.1f}s")
            result.figures["drain_s"] = f"{drain_s:.1f}"
        except TimeoutError as exc:
            lag = {p: ends[p] - o for p, o in self.committed().items() if ends[p] != o}
            result.check("lag returns to 0 (group committed)", False, f"{exc}; lag {lag}")
        self._check_replicas_settled()
        self.sampler.stop()
        self._check_memory()
        assert self._visibility is not None
        self._visibility.stop()
        self._verify()
        return result

    def _check_replicas_settled(self) -> None:
        """Every live replica reports no paused partition and zero lag on what it owns."""
        for replica in self.live():

            def settled(r: Replica = replica) -> bool:
                exposition = r.exposition()
                lags = [v for _, v in lag_samples(exposition)]
                return by_key(exposition)["fraud_paused_partitions"] == 0 and not any(lags)

            try:
                self.wait_until(settled, SETTLE_TIMEOUT_S, f"{replica.name} settled")
                self.result.check(f"{replica.name}: nothing paused, lag 0", True, "")
            except TimeoutError:
                exposition = replica.exposition()
                lags = {
                    labels["partition"]: int(value) for labels, value in lag_samples(exposition)
                }
                paused = by_key(exposition).get("fraud_paused_partitions")
                detail = f"paused={paused} lag={lags}"
                self.result.check(f"{replica.name}: nothing paused, lag 0", False, detail)

    def _check_memory(self) -> None:
        """In-flight records and bytes never above their bounds plus one fetch (a batch)."""
        s, peaks = self.settings, self.sampler.peaks
        records_bound = s.max_in_flight_records + s.max_batch_size
        bytes_bound = s.max_in_flight_bytes + s.max_batch_size * LOAD_RECORD_MAX_BYTES
        ok = peaks.samples > 0 and peaks.in_flight_records <= records_bound
        ok = ok and peaks.in_flight_bytes <= bytes_bound
        self.result.check(
            "memory within the in-flight bounds",
            ok,
            f"peak {peaks.in_flight_records:.0f} records (bound {records_bound}), "
            f"{peaks.in_flight_bytes:.0f} bytes (bound {bytes_bound}), {peaks.samples} samples",
        )
        self.result.figures["peak_in_flight"] = f"{peaks.in_flight_records:.0f}"
        self.result.figures["peak_rss_mb"] = f"{peaks.rss_mb:.0f}"

    def _verify(self) -> None:
        result, visibility = self.result, self._visibility
        try:
            inputs = read_inputs(self.bootstrap, self.input_topic)
            decisions = read_decisions(self.bootstrap, self.output_topic, visibility)
            letters = self.saved_dead_letters + read_dead_letters(self.bootstrap, self.dlq_topic)
        except (TimeoutError, RuntimeError) as exc:
            result.check("topics read to their end", False, str(exc))
            return
        report = verify(
            inputs,
            decisions,
            letters,
            self.faults,
            exactly_once=self.settings.exactly_once,
            rescoring_allowed=os.environ.get("FRAUD_CARD_HISTORY", "on") != "off",
        )
        result.report = report
        result.check("verifier", not report.violations(), "; ".join(report.violations()))
        if self.frozen is not None:
            late, duplicated, released = self.frozen.late_writes(inputs, decisions)
            result.figures["zombie_late_writes_visible"] = f"{late}"
            result.figures["others_released_at_thaw"] = f"{released}"
            if self.settings.exactly_once:
                result.check(
                    "no late write of the zombie repeats a decision",
                    duplicated == 0,
                    f"{duplicated} of {late}",
                )
        for example in report.examples:
            log.info("%s %s: %s", result.scenario, result.mode, example)
        for topic_check in self.topic_checks:
            topic_check(inputs, decisions)


def _exited_on_fatal_error(replica: Replica) -> bool:
    """Whether the replica exited 1 on a fatal transaction error (its log says so)."""
    if replica.process is None or replica.process.returncode != 1:
        return False
    text = replica.log_path.read_text(errors="replace")
    return "stopping on a fatal Kafka error" in text and "fatal transaction error" in text


def _code_of(release: Release | None) -> dict[str, Any]:
    """A replica's interpreter and working directory: this tree's (the defaults), or a
    release's."""
    return {} if release is None else {"python": str(release.python), "cwd": release.source}


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except (OSError, HTTPException, KeyError, ValueError, KafkaException):
        return False  # a replica starting, frozen or gone: not yet


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
