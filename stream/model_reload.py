"""Hot reload: the model a replica scores with, replaced between batches without a restart.

`FRAUD_MODEL_PATH` names the model source (`scorer.model_source`): a package directory, or a
symbolic link to one, which `fraud-model promote` repoints in one atomic rename; or an MLflow
registered model followed by alias (`models:/<name>@champion`), whose alias `fraud-model promote`
moves. `ModelReloader` looks at the source every `FRAUD_MODEL_POLL_S` on a thread of its own.
When what it names changes (another directory behind the link, a rewritten model.toml or
model.onnx, another version behind the alias), it loads the package there, checks it and hands
it over as a `ServingModel`:

- the manifest (`load_model_package`) and the thresholds against the configuration;
- the check in a child process, bounded in memory and time (`stream/package_check.py`): the
  graph opened, warmed up and sanity-scored there before this process opens it;
- the graph here (`OnnxScorer`) and the reasons' reference row, exactly as at start-up, and the
  sanity score again on this replica's device (`sanity_check`): its reference row (zeros where
  the package has none), the typical transactions of a short simulated stream
  (`stream/typical_rows.py`: cards with history, terminals and cards with frauds), and the
  recent real rows the scoring stage decided (`scorer/recent_rows.py`) must each score as a
  probability, so a graph that scores zeros and returns NaN for real transactions never serves;
- a warm-up of every batch shape, so the first batch it scores pays no set-up.

The scoring stage takes the new model at the start of its next batch (`BatchScorer`): a batch is
scored by one model from start to end, its decisions carry that model's version, and the swap
costs the batch one attribute read. A package that fails a check is refused: logged, counted in
`fraud_model_reloads_total{result="refused"}`, and the model in service keeps serving. The same
files are not tried again until they change. A source that cannot be read (MLflow down, the
package directory gone or unreadable) is counted as `result="unavailable"` and read again at the
next poll. A model that passes and then fails most records of a batch the model before it
decides is rolled back by the scoring stage (`stream/model_in_use.py`); the reloader has seen its
source already, so it is not loaded again until the source changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from plumbing.errors import ConfigurationError, ModelSourceUnavailableError, ScoreError
from scorer.decide import DecisionPolicy
from scorer.model import OnnxScorer
from scorer.model_package import ModelPackage, load_model_package
from scorer.model_source import ModelSource
from scorer.reasons import Explainer
from scorer.recent_rows import RecentRows
from stream.metrics import ServiceMetrics
from stream.package_check import check_package, manifest_digest, sanity_check
from stream.startup.config import ScorerSettings

log = logging.getLogger(__name__)


class ServingModel(NamedTuple):
    """Everything a batch needs from its model, replaced as one."""

    scorer: OnnxScorer
    #: The package's thresholds under the configuration's overrides.
    policy: DecisionPolicy
    #: Reasons of flagged decisions (None: off, or the package has no reference row).
    explainer: Explainer | None
    #: What its source named when it was read (a later change of the source is a new model).
    source: Hashable


def load_serving_model(
    config: ScorerSettings, source: ModelSource, identity: Hashable | None = None
) -> ServingModel:
    """Load the package `source` names now (or `identity` names, as the source gave it) and
    open its graph in this process, unchecked (`load_checked_model` checks it first).

    Raises ConfigurationError (one line: the package and what to fix) when it cannot serve,
    ModelSourceUnavailableError when the source cannot be asked."""
    # Asked before the files are read: a change while they are read is seen by the next poll.
    identity = source.identity() if identity is None else identity
    package = load_model_package(source.package_dir(identity))
    return _serving_model(config, package, config.decision_policy(package.thresholds), identity)


def load_checked_model(
    config: ScorerSettings,
    source: ModelSource,
    identity: Hashable | None = None,
    recent: npt.NDArray[np.float32] | None = None,
) -> ServingModel:
    """What a replica serves: the package `source` names (or `identity`), loaded, warmed up
    and sanity-scored with the `recent` rows by a child process first, bounded in memory and
    time (`stream/package_check.py`), then opened here and sanity-scored again on this
    replica's device.

    Raises ConfigurationError (one line) when it cannot serve, ModelSourceUnavailableError
    when the source cannot be asked or the package changed while it was checked."""
    identity = source.identity() if identity is None else identity
    package = load_model_package(source.package_dir(identity))
    policy = config.decision_policy(package.thresholds)
    checked = check_package(
        package.path,
        max_batch_size=config.max_batch_size,
        max_memory_mb=config.model_max_memory_mb,
        timeout_s=config.model_check_timeout_s,
        recent=recent,
    )
    if checked != manifest_digest(package.manifest):
        raise ModelSourceUnavailableError(
            f"model package {str(package.path)!r} changed while it was checked: it is read "
            "again at the next poll"
        )
    model = _serving_model(config, package, policy, identity)
    sanity_check(model.scorer, recent)
    return model


def _serving_model(
    config: ScorerSettings, package: ModelPackage, policy: DecisionPolicy, identity: Hashable
) -> ServingModel:
    scorer = OnnxScorer(
        package,
        config.device,
        device_id=config.device_id,
        cpu_threads=config.cpu_threads,
        max_batch_size=config.max_batch_size,
        max_memory_bytes=config.model_max_memory_mb * 1024 * 1024,
    )
    return ServingModel(scorer, policy, _explainer(config, scorer), identity)


def load_shadow_model(config: ScorerSettings, source: ModelSource) -> ServingModel:
    """The challenger `source` names (FRAUD_SHADOW_MODEL): checked like the served model, with
    its package's own thresholds (the FRAUD_*_THRESHOLD overrides are the served model's) and
    no reasons."""
    return load_checked_model(shadow_config(config), source)


def shadow_config(config: ScorerSettings) -> ScorerSettings:
    """The configuration a challenger is loaded and reloaded with."""
    return msgspec.structs.replace(
        config, review_threshold=None, decline_threshold=None, reasons="off"
    )


def _explainer(config: ScorerSettings, scorer: OnnxScorer) -> Explainer | None:
    if config.reasons == "off":
        return None
    reference = scorer.package.reference
    if reference is None:
        log.warning(
            "reasons are off: model package %s has no reference row (model.toml reference)",
            scorer.package.path,
        )
        return None
    return Explainer(scorer, scorer.package.feature_index, reference)


class ModelReloader:
    """Watches the model source and hands the scoring stage each new model that passes its
    checks (`take`)."""

    def __init__(
        self,
        config: ScorerSettings,
        metrics: ServiceMetrics,
        serving: ServingModel,
        *,
        source: ModelSource,
        role: str = "served",
        recent: RecentRows | None = None,
    ) -> None:
        """`serving`: the model loaded from `source` at start-up; `role`: which model this is,
        in logs and metrics (served, or shadow); `recent`: the real rows the scoring stage
        decided lately, which a new model must score too."""
        self._config = config
        self._metrics = metrics
        self._source = source
        self._role = role
        self._recent = recent
        self._seen = serving.source
        self._pending: ServingModel | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="model-reload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def take(self) -> ServingModel | None:
        """The model to score the next batch with, once, when a new one is ready."""
        with self._lock:
            model, self._pending = self._pending, None
        return model

    def check_now(self) -> bool:
        """Look at the source once; whether a new model was made ready."""
        try:
            identity = self._source.identity()
        except (ModelSourceUnavailableError, ConfigurationError) as exc:  # an alias on nothing
            return self._unavailable(exc)
        if identity == self._seen:
            return False
        recent = None if self._recent is None else self._recent.sample()
        try:
            model = load_checked_model(self._config, self._source, identity, recent)
            model.scorer.warm_up()
        except ModelSourceUnavailableError as exc:  # its download failed, or it changed
            return self._unavailable(exc)
        except (ConfigurationError, ScoreError) as exc:  # ScoreError: its warm-up failed
            self._seen = identity  # not tried again until it changes
            self._metrics.count_model_reload(self._role, "refused")
            log.error("%s model reload refused, the model in service stays: %s", self._role, exc)
            return False
        log.info(
            "%s model %s loaded from %s (%s): it scores from the next batch on",
            self._role,
            model.scorer.model_version,
            self._source,
            model.scorer.package.path,
        )
        self._seen = model.source
        self._metrics.count_model_reload(self._role, "loaded")
        with self._lock:
            self._pending = model  # a newer model replaces one not taken yet
        return True

    def _unavailable(self, exc: Exception) -> bool:
        """Counted and logged; the source is asked again at the next poll."""
        self._metrics.count_model_reload(self._role, "unavailable")
        log.warning("%s model source unavailable, the model in service stays: %s", self._role, exc)
        return False

    def _watch(self) -> None:
        while not self._stopping.wait(self._config.model_poll_s):
            try:
                self.check_now()
            except Exception:  # the watcher must outlive any surprise; the old model serves
                log.exception("%s model source %s could not be checked", self._role, self._source)
