"""`fraud-model import` and `inspect` with the real libraries: models trained here on
simulated feature rows, saved natively, imported, and scored again by ONNX Runtime."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import joblib
import lightgbm
import msgspec
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest
import xgboost
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from model_tools.cli import main
from scorer.catalogue import BY_NAME
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model_package import CARD_FILE, ONNX_FILE, load_model_package, write_model_package
from simulator.replay import simulate

Rows = npt.NDArray[np.float32]
N = NUM_FEATURES
#: The agreement every supported framework must reach, on rows the import never saw.
TOLERANCE = 1e-5
DIFF_LINE = re.compile(r"max \|native - onnx\| = (\S+) over (\d+) sample rows")


class Data(NamedTuple):
    """Simulated catalogue rows [rows, N]: a training part, the import's sample, held-out."""

    train: Rows
    labels: npt.NDArray[np.int64]
    sample: Rows
    held_out: Rows


@pytest.fixture(scope="module")
def data() -> Data:
    stream = simulate(seed=11, days=8, cards=800)
    x, y = stream.features, stream.is_fraud.astype(np.int64)
    half, three_quarters = len(x) // 2, 3 * len(x) // 4
    assert y[:half].sum() >= 50, "the training part needs frauds to learn from"
    return Data(x[:half], y[:half], x[half:three_quarters], x[three_quarters:])


def columns(names: tuple[str, ...]) -> list[int]:
    return [FEATURE_NAMES.index(name) for name in names]


Native = Callable[[Rows], npt.NDArray[np.float64]]


def fit_xgboost(x: Rows, y: npt.NDArray[np.int64], path: Path) -> Native:
    model = xgboost.XGBClassifier(n_estimators=40, max_depth=4, n_jobs=1, random_state=0)
    model.fit(x, y)
    model.save_model(path)
    return lambda rows: model.predict_proba(rows)[:, 1]


def fit_xgboost_booster(x: Rows, y: npt.NDArray[np.int64], path: Path) -> Native:
    """xgboost.train's Booster, as saved without the scikit-learn wrapper."""
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1}
    booster = xgboost.train(params, xgboost.DMatrix(x, y), num_boost_round=30)
    booster.save_model(path)
    return lambda rows: booster.predict(xgboost.DMatrix(rows)).astype(np.float64)


def fit_lightgbm(x: Rows, y: npt.NDArray[np.int64], path: Path) -> Native:
    model = lightgbm.LGBMClassifier(n_estimators=60, num_leaves=15, n_jobs=1, verbose=-1)
    model.fit(x, y)
    model.booster_.save_model(path)
    return lambda rows: np.asarray(model.booster_.predict(rows), np.float64)


def fit_forest(x: Rows, y: npt.NDArray[np.int64], path: Path) -> Native:
    model = RandomForestClassifier(n_estimators=30, max_depth=8, random_state=0).fit(x, y)
    joblib.dump(model, path)
    return lambda rows: model.predict_proba(rows)[:, 1]


def fit_logistic(x: Rows, y: npt.NDArray[np.int64], path: Path) -> Native:
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x, y)
    joblib.dump(model, path)
    return lambda rows: model.predict_proba(rows)[:, 1]


_SHUFFLED = tuple(np.random.default_rng(3).permutation(FEATURE_NAMES)[:20].tolist())


class Case(NamedTuple):
    framework: str
    file: str
    features: tuple[str, ...]
    fit: Callable[[Rows, npt.NDArray[np.int64], Path], Native]
    #: How the sample is written: "csv-header" (every catalogue column, picked by name), "csv" or
    #: "npy" (the model's columns, in its order).
    sample: str


CASES = [
    Case("xgboost", "model.json", FEATURE_NAMES, fit_xgboost, "csv-header"),
    Case("xgboost", "booster.ubj", _SHUFFLED, fit_xgboost_booster, "csv-header"),
    Case("lightgbm", "model.txt", _SHUFFLED, fit_lightgbm, "npy"),
    Case("sklearn", "forest.joblib", FEATURE_NAMES[::-1][:30], fit_forest, "csv"),
    Case("sklearn", "logistic.pkl", FEATURE_NAMES, fit_logistic, "npy"),
]


def write_sample(rows: Rows, features: tuple[str, ...], form: str, directory: Path) -> Path:
    if form == "csv-header":
        path = directory / "sample.csv"
        np.savetxt(path, rows, delimiter=",", header=",".join(FEATURE_NAMES), comments="")
    elif form == "csv":
        path = directory / "sample.csv"
        np.savetxt(path, rows[:, columns(features)], delimiter=",", fmt="%.9g")
    else:
        path = directory / "sample.npy"
        np.save(path, rows[:, columns(features)])
    return path


def import_args(
    framework: str, model: Path, features: tuple[str, ...], sample: Path, out: Path
) -> list[str]:
    return [
        "import",
        "--framework",
        framework,
        str(model),
        "--features",
        ",".join(features),
        "--sample",
        str(sample),
        "--out",
        str(out),
        "--name",
        f"fraud-{framework}",
        "--version",
        "1.0.0",
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.framework}-{c.file}")
def test_import_agrees_with_the_native_model_on_held_out_rows(
    case: Case, data: Data, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = columns(case.features)
    native = case.fit(data.train[:, index], data.labels, tmp_path / case.file)
    sample = write_sample(data.sample, case.features, case.sample, tmp_path)
    out = tmp_path / "package"

    args = import_args(case.framework, tmp_path / case.file, case.features, sample, out)
    assert main([*args, "--metric", "auc=0.9"]) == 0, capsys.readouterr().err
    printed = DIFF_LINE.search(capsys.readouterr().out)
    assert printed and int(printed[2]) == len(data.sample)
    assert float(printed[1]) <= TOLERANCE

    package = load_model_package(out)
    manifest = package.manifest
    assert manifest.features == list(case.features)
    assert manifest.model.version == package.version == "1.0.0"
    assert manifest.training.metrics == {"auc": 0.9}
    assert package.reference is not None
    np.testing.assert_array_equal(
        package.reference, np.median(data.sample[:, index], axis=0).astype(np.float32)
    )
    # What the service does: open the graph, feed it the package's columns of the full matrix.
    session = ort.InferenceSession(package.onnx, providers=["CPUExecutionProvider"])
    (graph_input,) = session.get_inputs()
    (graph_output,) = session.get_outputs()
    assert (graph_input.name, graph_input.type) == ("features", "tensor(float)")
    assert graph_input.shape[1] == len(case.features)
    assert (graph_output.name, graph_output.type, len(graph_output.shape)) == (
        "score",
        "tensor(float)",
        1,
    )
    held_out = np.ascontiguousarray(data.held_out[:, package.feature_index])
    (scores,) = session.run(None, {"features": held_out})
    expected = native(held_out)
    assert scores.shape == (len(held_out),)
    assert np.abs(scores - expected).max() <= TOLERANCE
    assert expected.max() - expected.min() > 0.5, "a model that scores every row alike"


def test_a_lightgbm_split_between_neighbouring_floats_keeps_its_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LightGBM's threshold is the double halfway between two neighbouring float32 values;
    rounded to the nearest float32 it would equal the upper one and send it left."""
    lower = np.nextafter(np.float32(1.0), np.float32(2.0))  # odd mantissa: the tie rounds up
    upper = np.nextafter(lower, np.float32(2.0))
    rows = np.random.default_rng(0).normal(size=(2000, 3)).astype(np.float32)
    rows[:, 0] = np.where(np.arange(len(rows)) % 2 == 0, lower, upper)
    labels = (rows[:, 0] == upper).astype(np.int64)
    booster = lightgbm.train(
        {"objective": "binary", "num_leaves": 4, "min_data_in_leaf": 5, "verbose": -1},
        lightgbm.Dataset(rows, labels),
        num_boost_round=5,
    )
    booster.save_model(tmp_path / "model.txt")
    np.save(tmp_path / "sample.npy", rows)
    features = FEATURE_NAMES[:3]
    out = tmp_path / "package"
    args = import_args("lightgbm", tmp_path / "model.txt", features, tmp_path / "sample.npy", out)
    assert main(args) == 0, capsys.readouterr().err

    session = ort.InferenceSession(load_model_package(out).onnx)
    (scores,) = session.run(None, {"features": rows})
    assert np.abs(scores - booster.predict(rows)).max() <= TOLERANCE


@pytest.fixture(scope="module")
def xgboost_model(data: Data, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("xgboost") / "model.json"
    fit_xgboost(data.train, data.labels, path)
    return path


@pytest.fixture
def sample_npy(data: Data, tmp_path: Path) -> Path:
    path = tmp_path / "sample.npy"
    np.save(path, data.sample)
    return path


def _sample(rows: Rows, tmp_path: Path) -> str:
    path = tmp_path / "rows.npy"
    np.save(path, rows)
    return str(path)


def _with(args: list[str], option: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def _reordered_model(path: Path, tmp_path: Path) -> str:
    model = xgboost.XGBClassifier()
    model.load_model(path)
    model.get_booster().feature_names = list(FEATURE_NAMES[::-1])
    model.save_model(tmp_path / "named.json")
    return str(tmp_path / "named.json")


def _swap(args: list[str], old: Path, new: str) -> list[str]:
    return [new if arg == str(old) else arg for arg in args]


def _copy_as(path: Path, tmp_path: Path, name: str) -> str:
    (tmp_path / name).write_bytes(path.read_bytes())
    return str(tmp_path / name)


#: (id, how the good arguments are spoiled, what the one-line error must say)
REFUSALS: list[tuple[str, Callable[[list[str], Path, Path, Data], list[str]], list[str]]] = [
    (
        "feature-count",
        lambda a, m, t, d: _with(
            _with(a, "--features", ",".join(FEATURE_NAMES[:-1])),
            "--sample",
            _sample(d.sample[:, :-1], t),
        ),
        [f"reads {N} features but {N - 1} are named", "in its column order"],
    ),
    (
        "unknown-feature",
        lambda a, m, t, d: _with(
            a, "--features", ",".join(FEATURE_NAMES).replace("card_tx_1h", "card_tx_1hour")
        ),
        [
            "['card_tx_1hour'] are not in the feature catalogue",
            "did you mean 'card_tx_1hour' → 'card_tx_1h'",
            "see docs/features.md",
        ],
    ),
    (
        "feature-twice",
        lambda a, m, t, d: _with(a, "--features", ",".join([*FEATURE_NAMES[:-1], "log_amount"])),
        ["['log_amount'] are named more than once"],
    ),
    (
        "negative-tolerance",
        lambda a, m, t, d: [*a, "--tolerance=-1e-5"],
        ["--tolerance must be between 0 and 0.01, got -1e-05"],
    ),
    (
        "nan-tolerance",
        lambda a, m, t, d: [*a, "--tolerance", "nan"],
        ["--tolerance must be between 0 and 0.01, got nan"],
    ),
    (
        "huge-tolerance",
        lambda a, m, t, d: [*a, "--tolerance", "0.5"],
        ["--tolerance must be between 0 and 0.01, got 0.5"],
    ),
    (
        "scores-differ",
        lambda a, m, t, d: [*a, "--tolerance", "0"],
        ["differ from the native model's by up to", "above --tolerance 0; nothing written"],
    ),
    (
        "column-order",
        lambda a, m, t, d: _swap(a, m, _reordered_model(m, t)),
        [f"was trained on the columns [{FEATURE_NAMES[-1]!r},", "model's column order"],
    ),
    (
        "small-sample",
        lambda a, m, t, d: _with(a, "--sample", _sample(d.sample[:50], t)),
        ["has 50 rows: give at least 100"],
    ),
    (
        "non-finite-sample",
        lambda a, m, t, d: _with(
            a, "--sample", _sample(np.where(np.arange(N) == 3, np.inf, d.sample), t)
        ),
        ["row 0 (and", "not a finite float32"],
    ),
    (
        "missing-model",
        lambda a, m, t, d: _swap(a, m, str(t / "absent.json")),
        ["absent.json' does not exist"],
    ),
    (
        "wrong-suffix",
        lambda a, m, t, d: _swap(a, m, _copy_as(m, t, "model.txt")),
        ["a xgboost model is read from .json or .ubj"],
    ),
    (
        "no-sample",
        lambda a, m, t, d: a[: a.index("--sample")] + a[a.index("--sample") + 2 :],
        ["--sample is required", "docs/models.md"],
    ),
    (
        "review-above-decline",
        lambda a, m, t, d: [*a, "--review", "0.9", "--decline", "0.8"],
        ["0 <= --review <= --decline <= 1, got 0.9 and 0.8"],
    ),
]


@pytest.mark.parametrize(
    ("spoil", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_a_bad_import_is_refused_in_one_line_and_writes_nothing(
    spoil: Callable[[list[str], Path, Path, Data], list[str]],
    message: list[str],
    xgboost_model: Path,
    sample_npy: Path,
    data: Data,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "package"
    good = import_args("xgboost", xgboost_model, FEATURE_NAMES, sample_npy, out)
    assert main(spoil(good, xgboost_model, tmp_path, data)) == 2
    error = capsys.readouterr().err
    assert error.startswith("fraud-model import: ") and error.count("\n") == 1
    for part in message:
        assert part in error
    assert not out.exists()
    assert not list(tmp_path.glob(".package*")), "a staging directory was left behind"


def test_hist_gradient_boosting_is_named_unsupported(
    data: Data, sample_npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """skl2onnx 1.20 fails to build its TreeEnsemble; docs/models.md says so."""
    model = HistGradientBoostingClassifier(max_iter=5).fit(data.train, data.labels)
    joblib.dump(model, tmp_path / "model.joblib")
    out = tmp_path / "package"
    args = import_args("sklearn", tmp_path / "model.joblib", FEATURE_NAMES, sample_npy, out)
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "skl2onnx 1.20.0 cannot convert the HistGradientBoostingClassifier" in error
    assert error.count("\n") == 1
    assert not out.exists()


def test_a_classifier_of_three_classes_is_refused(
    data: Data, sample_npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = data.train[:300]
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    joblib.dump(model.fit(rows, np.arange(len(rows)) % 3), tmp_path / "model.joblib")
    out = tmp_path / "package"
    args = import_args("sklearn", tmp_path / "model.joblib", FEATURE_NAMES, sample_npy, out)
    assert main(args) == 2
    assert "import reads a fitted binary classifier" in capsys.readouterr().err
    assert not out.exists()


def test_a_pickled_xgboost_or_lightgbm_model_is_sent_to_its_own_framework(
    data: Data, sample_npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = lightgbm.LGBMClassifier(n_estimators=5, verbose=-1).fit(data.train, data.labels)
    joblib.dump(model, tmp_path / "model.joblib")
    args = import_args(
        "sklearn", tmp_path / "model.joblib", FEATURE_NAMES, sample_npy, tmp_path / "package"
    )
    assert main(args) == 2
    assert (
        "holds a LGBMClassifier: save it in lightgbm's own format and import it with "
        "--framework lightgbm"
    ) in capsys.readouterr().err


def test_force_replaces_a_package_and_nothing_else(
    xgboost_model: Path, sample_npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "package"
    args = import_args("xgboost", xgboost_model, FEATURE_NAMES, sample_npy, out)
    assert main(args) == 0
    (out / CARD_FILE).write_text("the card of the model this package held before\n")

    assert main(args) == 2
    assert "is not empty: name a new directory, or pass --force" in capsys.readouterr().err
    assert main([*args, "--version", "2.0.0", "--force"]) == 0
    assert load_model_package(out).version == "2.0.0"
    assert not (out / CARD_FILE).exists(), "the old package's card describes another model"

    (out / "notes.txt").write_text("not part of a package\n")
    assert main([*args, "--force"]) == 2
    assert "also holds ['notes.txt']" in capsys.readouterr().err


@pytest.fixture
def package(
    xgboost_model: Path, sample_npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Path:
    out = tmp_path / "package"
    names = tmp_path / "features.txt"
    names.write_text("# the model's columns, in order\n" + "\n".join(FEATURE_NAMES) + "\n\n")
    args = import_args("xgboost", xgboost_model, FEATURE_NAMES, sample_npy, out)
    args[args.index("--features") : args.index("--features") + 2] = ["--features-file", str(names)]
    extra = ["--training-data", "simulated stream, seed 11", "--training-window", "days 0-3"]
    assert main([*args, *extra, "--metric", "auc=0.91", "--review", "0.4"]) == 0
    capsys.readouterr()
    return out


def test_inspect_prints_the_card(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(package)]) == 0
    text = capsys.readouterr().out
    sha256 = load_model_package(package).manifest.onnx_sha256
    for line in (
        "model        fraud-xgboost 1.0.0",
        f"path         {package}",
        f"sha256       {sha256}",
        f"input        features tensor(float) ['batch', {N}]",
        "output       score tensor(float) ['batch']",
        "graph        fits the manifest",
        "score        P(fraud) from the imported xgboost XGBClassifier's predict_proba (class 1)",
        "calibration  none",
        "thresholds   review 0.4, decline 0.8; chosen by: not chosen",
        "trained on   simulated stream, seed 11",
        "window       days 0-3",
        "metrics      auc 0.91",
        f"reference    present ({N} values): reason codes on",
        "model card   MODEL_CARD.md absent",
        f"features     {N} (input column, name, meaning)",
    ):
        assert line in text
    for i, name in enumerate(FEATURE_NAMES):
        assert re.search(rf"^ +{i}  {name} +{re.escape(BY_NAME[name].description)}$", text, re.M)


def test_inspect_json(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(package), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert (card["name"], card["version"], card["path"]) == ("fraud-xgboost", "1.0.0", str(package))
    assert card["graph"]["agrees"] is True and card["graph"]["problems"] == []
    assert card["graph"]["inputs"] == [
        {"name": "features", "type": "tensor(float)", "shape": ["batch", N]}
    ]
    assert card["graph"]["outputs"] == [
        {"name": "score", "type": "tensor(float)", "shape": ["batch"]}
    ]
    assert card["graph"]["metadata"]["converter"].startswith("onnxmltools ")
    assert [f["name"] for f in card["features"]] == list(FEATURE_NAMES)
    assert card["features"][0]["description"] == BY_NAME[FEATURE_NAMES[0]].description
    assert card["thresholds"]["review"] == 0.4
    assert card["training"]["metrics"] == {"auc": 0.91}
    assert len(card["reference"]) == N
    assert card["model_card"] is False


def test_inspect_refuses_a_tampered_graph(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = package / ONNX_FILE
    graph.write_bytes(graph.read_bytes().replace(b"score", b"scorf"))
    assert main(["inspect", str(package)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "model.onnx has sha256" in captured.err and "package it again" in captured.err


def test_inspect_flags_a_graph_that_does_not_fit_its_manifest(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load_model_package(package)
    manifest = loaded.manifest
    dropped = manifest.features[-1]
    drift = manifest.drift
    if drift is not None:  # the drift reference must not name the feature dropped
        kept = {name: h for name, h in drift.features.items() if name != dropped}
        drift = msgspec.structs.replace(drift, features=kept)
    short = msgspec.structs.replace(
        manifest,
        features=manifest.features[:-1],
        reference=manifest.reference[:-1],
        drift=drift,
    )
    write_model_package(package, loaded.onnx, short)
    assert main(["inspect", str(package), "--json"]) == 1
    card = json.loads(capsys.readouterr().out)
    assert card["graph"]["agrees"] is False
    assert card["graph"]["problems"] == [
        f"the input is tensor(float) ['batch', {N}], the manifest names {N - 1} features: "
        f"float32 [batch, {N - 1}] is needed"
    ]


def test_inspect_of_a_directory_that_is_no_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path / "absent")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["import", "--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--framework {xgboost,lightgbm,sklearn}",
        "MODEL_FILE",
        "--features NAMES",
        "--features-file FILE",
        "--out DIR",
        "--name NAME",
        "--version VERSION",
        "--sample FILE",
        "--tolerance TOLERANCE",
        "--review REVIEW",
        "--decline DECLINE",
        "--thresholds-chosen-by TEXT",
        "--calibration {none,platt,isotonic}",
        "--training-data TEXT",
        "--training-window TEXT",
        "--metric NAME=VALUE",
        "--force",
    ):
        assert f"{option} " in text, option
