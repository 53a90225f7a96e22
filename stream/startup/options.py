"""Every setting of `fraud-scorer run`, declared once: name, type and bounds, environment
variable and help, default (`plumbing/settings.py` makes flags, `--help` and errors of them).
Three classes in a chain, in the order `--help` lists them: how records flow
(`stream/startup/flow_options.py`), what a decision reads besides its record
(`stream/startup/decision_input_options.py`), and here the model, the device and the metrics
server.

`ScorerSettings` (`stream/startup/config.py`) adds the checks that involve several settings and the
values derived from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from plumbing.settings import Topic, meta
from scorer.runtime import Device
from stream.package_check import DEFAULT_TIMEOUT_S as DEFAULT_CHECK_TIMEOUT_S
from stream.startup.decision_input_options import DecisionInputOptions

SHIPPED_MODEL_PATH = Path(__file__).resolve().parents[2] / "scorer" / "models" / "fraud-gbdt"


class ScorerOptions(DecisionInputOptions, frozen=True, kw_only=True):
    """The declarations: name, type, bounds, environment variable, help, default (the
    settings every service shares come first, from `ServiceSettings`)."""

    model_path: Annotated[
        str,
        meta(
            "FRAUD_MODEL_PATH",
            "model package to score with: a directory holding model.onnx and its manifest "
            "model.toml, or a link to one (docs/models.md; `fraud-model import` makes one, "
            "`fraud-model promote` repoints a link); or an MLflow registered model, "
            "models:/<name>@<alias> or models:/<name>/<version>, read from MLFLOW_TRACKING_URI "
            "(the mlflow extra; `fraud-model promote` moves the alias)",
        ),
    ] = str(SHIPPED_MODEL_PATH)
    model_poll_s: Annotated[
        float,
        meta(
            "FRAUD_MODEL_POLL_S",
            "how often, in seconds, FRAUD_MODEL_PATH is looked at for a new package, which then "
            "serves from the next batch without a restart (docs/models.md, Hot reload); 0: "
            "never, the package read at start serves until the replica stops",
            ge=0,
            le=86_400,
        ),
    ] = 5.0
    model_max_memory_mb: Annotated[
        int,
        meta(
            "FRAUD_MODEL_MAX_MEMORY_MB",
            "most memory, in MiB, a model package's graph may take for its working tensors "
            "(weights apart) when it is checked, in a child process, before the replica opens "
            "it; on a GPU also each session's CUDA arena while it serves: a package whose graph "
            "needs more is refused at start-up or reload (docs/models.md, Limits of a package)",
            ge=16,
            le=1_048_576,
        ),
    ] = 1024
    model_check_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_MODEL_CHECK_TIMEOUT_S",
            "most seconds the check of a model package (served or shadow; loaded, warmed up "
            "and sanity-scored in a child process before the replica opens it) may take: a "
            "package whose check runs longer is refused at start-up or reload "
            "(docs/models.md, Limits of a package)",
            ge=1,
            le=3_600,
        ),
    ] = DEFAULT_CHECK_TIMEOUT_S
    shadow_model: Annotated[
        str | None,
        meta(
            "FRAUD_SHADOW_MODEL",
            "challenger model package (a directory, a link to one, or an MLflow models:/ URI) "
            "scored in shadow on every decided record: its scores go to FRAUD_SHADOW_TOPIC and "
            "the metrics, never into a decision (docs/models.md, Shadow scoring); reloaded like "
            "FRAUD_MODEL_PATH",
        ),
    ] = None
    shadow_topic: Annotated[
        Topic | None,
        meta(
            "FRAUD_SHADOW_TOPIC",
            "topic of the challenger's shadow decisions (default: <output_topic>.shadow)",
        ),
    ] = None
    shadow_timeout_ms: Annotated[
        float,
        meta(
            "FRAUD_SHADOW_TIMEOUT_MS",
            "the challenger scores each batch on its own thread once the batch's decisions are "
            "sent, never delaying one; a batch it has not scored within this many milliseconds "
            'gets no shadow records (fraud_shadow_records_dropped_total{reason="late"})',
            gt=0,
            le=600_000,
        ),
    ] = 5_000.0
    device: Annotated[
        Device,
        meta(
            "FRAUD_DEVICE",
            "execution provider: auto (CUDA if it works, else CPU), cuda, cpu or tensorrt "
            "(TensorRT, else CUDA, else CPU); a GPU that cannot run falls back to CPU with one "
            "warning",
        ),
    ] = "auto"
    device_id: Annotated[
        int,
        meta("FRAUD_DEVICE_ID", "CUDA device ordinal the cuda and tensorrt devices run on", ge=0),
    ] = 0
    cpu_threads: Annotated[
        int,
        meta(
            "FRAUD_CPU_THREADS",
            "ONNX Runtime intra-op threads on the CPU; 1 leaves the other cores to Kafka's "
            "threads, 0 = ONNX Runtime's default (one per physical core)",
            ge=0,
            le=1_024,
        ),
    ] = 1
    review_threshold: Annotated[
        float | None,
        meta(
            "FRAUD_REVIEW_THRESHOLD",
            "scores at or above this go to review, in [0, 1]; default: the model package's "
            "(model.toml [thresholds])",
        ),
    ] = None
    decline_threshold: Annotated[
        float | None,
        meta(
            "FRAUD_DECLINE_THRESHOLD",
            "scores at or above this are declined, in [0, 1]; default: the model package's "
            "(model.toml [thresholds])",
        ),
    ] = None
    metrics_host: Annotated[
        str,
        meta("FRAUD_METRICS_HOST", "address of the /metrics, /healthz and /readyz server"),
    ] = "0.0.0.0"
    metrics_port: Annotated[
        int,
        meta(
            "FRAUD_METRICS_PORT",
            "port of the /metrics, /healthz and /readyz server; 0 disables it",
            ge=0,
            le=65_535,
        ),
    ] = 9102
    shutdown_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_SHUTDOWN_TIMEOUT_S",
            "on SIGTERM, how long the whole drain may take (score what is held, wait for its "
            "outputs, commit) before the replica exits",
            gt=0,
        ),
    ] = 30.0
