"""`fraud-model`: make a model package from a trained model (`import`), read one (`inspect`),
register one in an MLflow model registry (`publish`), and make one the model every replica
serves (`promote`).

This module parses and checks arguments, calls `model_tools.importing` or reads a package
(`model_tools.inspection`), and turns the outcome into output and an exit status: 0 done, 1
`inspect` found a graph that does not fit its manifest (the card says how), 2 a refusal or a bad
package (one line on stderr), 3 the MLflow server could not be reached or refused (one line; try
again).
`import` needs the `import` extra (the converters); `inspect` only the service's dependencies.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, get_args

from model_tools import conversion, importing
from model_tools.inspection import describe, render_text
from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError, ModelSourceUnavailableError
from plumbing.kafka_settings import redact_urls
from plumbing.logs import configure_logging
from scorer.model_package import (
    Calibration,
    load_model_package,
    promote,
)
from scorer.model_source import (
    MLFLOW_PREFIX,
    MlflowSource,
    is_mlflow_uri,
    move_mlflow_alias,
    publish_to_mlflow,
)

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

PROG = "fraud-model"


class _Parser(argparse.ArgumentParser):
    """An argument parser that reports a bad argument in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _metric(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name.strip() or not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER such as auc=0.91, got {text!r}")
    return name.strip(), number


def build_parser() -> argparse.ArgumentParser:
    """The `fraud-model` command line."""
    parser = _Parser(
        prog=PROG,
        description="Make a model package (model.onnx + model.toml, docs/models.md) from a "
        "trained XGBoost, LightGBM or scikit-learn classifier, and inspect one.",
        epilog=f"exit status: {EXIT_OK} done, {EXIT_MISMATCH} inspect: the graph does not fit "
        f"its manifest, {EXIT_USAGE} a refusal, bad arguments or a bad package (one line)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    imp = commands.add_parser(
        "import",
        help="convert a trained classifier to a checked model package",
        description="Load a trained binary classifier, convert it to ONNX (onnxmltools for "
        "XGBoost and LightGBM, skl2onnx for scikit-learn), score --sample with both the native "
        "model and ONNX Runtime's CPU provider, and write the package only when they agree "
        f"within --tolerance. Needs the import extra: {conversion.EXTRA_HINT}.",
    )
    imp.add_argument(
        "--framework",
        required=True,
        choices=conversion.FRAMEWORKS,
        help="what trained MODEL_FILE: xgboost (.json/.ubj, XGBClassifier.save_model), "
        "lightgbm (Booster.save_model text file), sklearn (.joblib/.pkl of a classifier or a "
        "Pipeline ending in one; it runs code when loaded: import only your own files)",
    )
    imp.add_argument("model_file", type=Path, metavar="MODEL_FILE", help="the native model file")
    names = imp.add_mutually_exclusive_group(required=True)
    names.add_argument(
        "--features",
        metavar="NAMES",
        help="the model's input columns, comma-separated, in its column order, named from the "
        "feature catalogue (docs/features.md)",
    )
    names.add_argument(
        "--features-file",
        type=Path,
        metavar="FILE",
        help="the same, one name a line (blank lines and # comments skipped)",
    )
    imp.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="the package directory to write: new or empty (see --force)",
    )
    imp.add_argument("--name", required=True, help="model name, e.g. fraud-xgb")
    imp.add_argument("--version", required=True, help="model version, carried by every decision")
    imp.add_argument(
        "--sample",
        type=Path,
        metavar="FILE",
        help="required: at least 100 feature rows (a few thousand is better), held out from "
        "the model's training: .npy [rows, features] in the model's column order, or .csv "
        "(with a header of catalogue names the columns are picked by name). Native and ONNX "
        "scores are compared on it, and its per-column median is the package's reference row",
    )
    imp.add_argument(
        "--tolerance",
        type=float,
        default=importing.DEFAULT_TOLERANCE,
        help=f"largest |native - ONNX| score accepted, 0 to {importing.MAX_TOLERANCE:g} "
        "(default: %(default)g)",
    )
    imp.add_argument(
        "--review",
        type=float,
        default=importing.DEFAULT_REVIEW,
        help="scores at or above it go to review, unless FRAUD_REVIEW_THRESHOLD says otherwise "
        "(default: %(default)s)",
    )
    imp.add_argument(
        "--decline",
        type=float,
        default=importing.DEFAULT_DECLINE,
        help="scores at or above it are declined, unless FRAUD_DECLINE_THRESHOLD says otherwise "
        "(default: %(default)s)",
    )
    imp.add_argument(
        "--thresholds-chosen-by",
        metavar="TEXT",
        default=importing.DEFAULT_CHOSEN_BY,
        help="how the thresholds were chosen: the goal and the data (default: says they were not)",
    )
    imp.add_argument(
        "--calibration",
        choices=get_args(Calibration),
        default="none",
        help="how the model's probabilities were calibrated (default: %(default)s)",
    )
    imp.add_argument(
        "--training-data",
        metavar="TEXT",
        default=importing.NOT_GIVEN,
        help="what it was trained on (default: %(default)r)",
    )
    imp.add_argument(
        "--training-window",
        metavar="TEXT",
        default=importing.NOT_GIVEN,
        help="the training window, in words or dates (default: %(default)r)",
    )
    imp.add_argument(
        "--metric",
        action="append",
        type=_metric,
        default=[],
        metavar="NAME=VALUE",
        help="a validation figure, e.g. auc=0.91; repeat for several (default: none)",
    )
    imp.add_argument(
        "--force",
        action="store_true",
        help="replace the package already in --out (default: refuse a non-empty --out)",
    )

    inspect = commands.add_parser(
        "inspect",
        help="print a package's card and check its graph against its manifest",
        description="Load a package (checking its hash), open its graph on ONNX Runtime's CPU "
        "provider and print what it reads, what it means and how it was made.",
    )
    inspect.add_argument("package", type=Path, metavar="DIR", help="the package directory")
    inspect.add_argument(
        "--json", action="store_true", help="print one JSON object (default: text)"
    )

    promote = commands.add_parser(
        "promote",
        help="make a package the one every replica serves, without restarting them",
        description="Check the package, then repoint the model source every replica's "
        "FRAUD_MODEL_PATH names: a symbolic link (--source), repointed in one atomic rename, "
        "or an MLflow registered model's alias (--alias), moved to the version. Each replica "
        "sees it within FRAUD_MODEL_POLL_S, checks it again (graph, warm-up, a sanity score) "
        "and serves it from its next batch; one that refuses it keeps serving the model before "
        'and counts fraud_model_reloads_total{result="refused"}.',
    )
    promote.add_argument(
        "package",
        metavar="PACKAGE",
        help="the package to serve: a directory, or an MLflow version models:/<name>/<version>",
    )
    where = promote.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--source",
        type=Path,
        metavar="LINK",
        help="for a directory: the replicas' FRAUD_MODEL_PATH, a symbolic link, made if it "
        "does not exist",
    )
    where.add_argument(
        "--alias",
        metavar="ALIAS",
        help="for an MLflow version: the alias the replicas follow (FRAUD_MODEL_PATH="
        "models:/<name>@<alias>), read from MLFLOW_TRACKING_URI",
    )

    publish = commands.add_parser(
        "publish",
        help="register a package as a version of an MLflow registered model",
        description="Check the package, log it as the artifacts of a run and register it as "
        "the next version of the registered model (made if new) on the MLflow tracking server "
        "at MLFLOW_TRACKING_URI, with MLflow's own credentials (MLFLOW_TRACKING_TOKEN, or "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD). Needs the mlflow extra. "
        "Prints the version's models:/ URI; nothing serves it until an alias the replicas "
        "follow names it (--alias here, or fraud-model promote later).",
    )
    publish.add_argument("package", type=Path, metavar="DIR", help="the package directory")
    publish.add_argument(
        "--registered-model",
        required=True,
        metavar="NAME",
        help="the registered model's name (the <name> of models:/<name>@<alias>)",
    )
    publish.add_argument(
        "--alias",
        metavar="ALIAS",
        help="also move this alias to the new version (default: move none; a shadow alias "
        "such as challenger is a safe first step)",
    )
    publish.add_argument(
        "--experiment",
        default="fraud-model-packages",
        metavar="NAME",
        help="the experiment its run is logged under (default: fraud-model-packages)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if not logging.getLogger().handlers:  # run as a command, not called by a host program
        configure_logging("WARNING", "text")  # MLflow's warnings, masked like the service's
    try:
        for warning in check_environment(PROG):
            print(f"{PROG} {args.command}: {warning}", file=sys.stderr)
        if args.command == "import":
            return _import(args)
        if args.command == "promote":
            return _promote(args.package, args.source, args.alias)
        if args.command == "publish":
            return _publish(args)
        return _inspect(args.package, args.json)
    except ConfigurationError as exc:
        print(f"{PROG} {args.command}: {redact_urls(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except ModelSourceUnavailableError as exc:
        print(f"{PROG} {args.command}: {redact_urls(str(exc))}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _import(args: argparse.Namespace) -> int:
    if args.sample is None:
        raise ConfigurationError(
            "--sample is required: give at least 100 feature rows of the model's columns "
            "(.npy or .csv), held out from its training; docs/models.md shows how to make "
            "them with the simulator"
        )
    metrics = dict(args.metric)
    if len(metrics) != len(args.metric):
        raise ConfigurationError("--metric names one figure twice")
    request = importing.ImportRequest(
        framework=args.framework,
        model_file=args.model_file,
        features=_feature_names(args.features, args.features_file),
        out=args.out,
        name=args.name,
        version=args.version,
        sample=args.sample,
        tolerance=args.tolerance,
        review=args.review,
        decline=args.decline,
        thresholds_chosen_by=args.thresholds_chosen_by,
        calibration=args.calibration,
        training_data=args.training_data,
        training_window=args.training_window,
        metrics=metrics,
        force=args.force,
    )
    result = importing.import_model(request)
    package, check = result.package, result.check
    print(f"imported {args.model_file} ({args.framework} {result.native.kind}) → {package.path}")
    print(f"  model     {package.manifest.model.name} {package.version}")
    print(f"  features  {len(package.manifest.features)}")
    print(
        f"  check     max |native - onnx| = {check.max_abs_diff:.3g} over {check.rows} sample "
        f"rows (tolerance {args.tolerance:g})"
    )
    print(f"  sha256    {package.manifest.onnx_sha256}")
    return EXIT_OK


def _feature_names(text: str | None, path: Path | None) -> tuple[str, ...]:
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigurationError(f"--features-file: {exc}") from exc
        names = [line.strip() for line in lines]
        return tuple(name for name in names if name and not name.startswith("#"))
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


def _promote(package: str, source: Path | None, alias: str | None) -> int:
    if is_mlflow_uri(package):
        if alias is None:
            raise ConfigurationError(f"{package} is an MLflow version: promote it with --alias")
        registry = MlflowSource(package)
        _check_fits(registry.package_dir(registry.identity()))
        moved_from = move_mlflow_alias(package, alias)
        was = "no version" if moved_from is None else f"version {moved_from}"
        print(f"promoted {package} as @{alias} of {registry.name}, was {was}")
        return EXIT_OK
    if source is None:
        raise ConfigurationError(f"{package} is a directory: promote it with --source LINK")
    version = _check_fits(Path(package))
    before = promote(Path(package), source)
    was = "nothing" if before is None else str(before)
    print(f"promoted {version} ({Path(package).resolve()}) at {source}, was {was}")
    return EXIT_OK


def _check_fits(package: Path) -> str:
    """The package's version; ConfigurationError unless its graph fits its manifest."""
    card = describe(load_model_package(package))
    if not card["graph"]["agrees"]:
        raise ConfigurationError(
            f"{package} does not fit its manifest: {'; '.join(card['graph']['problems'])} "
            f"(fraud-model inspect {package})"
        )
    return str(card["version"])


def _publish(args: argparse.Namespace) -> int:
    version = _check_fits(args.package)
    number = publish_to_mlflow(
        args.package, args.registered_model, alias=args.alias, experiment=args.experiment
    )
    uri = f"{MLFLOW_PREFIX}{args.registered_model}/{number}"
    moved = f", @{args.alias} names it" if args.alias else ""
    print(f"published {version} ({args.package.resolve()}) as {uri}{moved}")
    return EXIT_OK


def _inspect(path: Path, as_json: bool) -> int:
    package = load_model_package(path)
    card = describe(package)
    print(json.dumps(card, indent=2) if as_json else render_text(card))
    return EXIT_OK if card["graph"]["agrees"] else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
