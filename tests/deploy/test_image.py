"""The image is built from what it needs and nothing else: the Dockerfile copies exactly the
package, installs the lock's dependencies before the source, runs as non-root; each platform
installs one ONNX Runtime build, and each lock pins every runtime dependency. Nothing here needs
Docker: the files are parsed (tests/deploy/repo.py)."""

from __future__ import annotations

import shlex

import pytest
from packaging.requirements import Requirement

from tests.deploy.repo import (
    ROOT,
    build_args,
    copy_sources,
    dockerfile,
    expand,
    ignored,
    instructions,
    locked,
    pyproject,
    runtime_requirements,
    variants,
)


def test_dockerfile_copies_exactly_the_package_and_nothing_ignored() -> None:
    assert {"cpu", "gpu"} <= variants()
    for variant in variants():
        sources = [expand(source, VARIANT=variant) for source in copy_sources()]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
        project = pyproject()
        packages = project["tool"]["setuptools"]["packages"]
        needed = {"pyproject.toml", project["project"]["readme"], f"requirements/{variant}.txt"}
        top_level = {package.split(".")[0] for package in packages}
        assert set(sources) == needed | top_level, "copy what `pip install .` needs, no more"
    for package, globs in project["tool"]["setuptools"]["package-data"].items():
        for pattern in globs:
            matches = list((ROOT / package.replace(".", "/")).glob(pattern))
            assert matches, f"package-data {package}/{pattern} matches nothing"
            for match in matches:
                assert not ignored(str(match.relative_to(ROOT))), match
    for package in packages:
        for module in (ROOT / package.replace(".", "/")).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert not ignored(str(module.relative_to(ROOT))), module


def test_dependencies_are_installed_before_the_source_is_copied() -> None:
    # An edit of the source or the README must not reinstall the dependencies: everything
    # before the first COPY of a package depends on the lock alone.
    packages = {p.split(".")[0] for p in pyproject()["tool"]["setuptools"]["packages"]}
    steps = dockerfile()
    first_source = next(
        i
        for i, (kw, rest) in enumerate(steps)
        if kw == "COPY" and set(shlex.split(rest)) & packages
    )
    lock_copy = next(
        i for i, (kw, rest) in enumerate(steps) if kw == "COPY" and "requirements/" in rest
    )
    installs = [(i, rest) for i, (kw, rest) in enumerate(steps) if kw == "RUN" and " -r " in rest]
    assert installs, "no `pip install -r <lock>` step"
    for i, rest in installs:
        assert lock_copy < i < first_source, "the lock's install must come before the source"
        assert "--require-hashes" in rest and "--mount=type=cache" in rest, rest
    project_install = [rest for kw, rest in steps[first_source:] if kw == "RUN" and "/src" in rest]
    assert project_install and all("--no-deps" in rest for rest in project_install), (
        "the project itself is installed without dependencies: the lock gave the variant's"
    )


def test_dockerignore_keeps_local_state_out() -> None:
    local_state = [
        *(".venv/bin/python", ".kafka/data", ".git/HEAD", "tests/deploy/test_compose.py"),
        *(".mypy_cache/x", ".pytest_cache/x", ".ruff_cache/x", "fraud_scorer.egg-info/PKG-INFO"),
        *(".tools/bin/helm", "stream/__pycache__/cli.cpython-312.pyc"),
    ]
    for path in local_state:
        assert ignored(path), f".dockerignore lets {path} into the build context"


def test_dockerfile_runs_as_non_root_on_a_selectable_base() -> None:
    (user,) = instructions("USER")
    assert user.split(":")[0] not in ("root", "0")
    assert "BASE_IMAGE" in build_args()
    assert any(rest.startswith("${BASE_IMAGE}") for rest in instructions("FROM"))


#: (sys_platform, platform_machine) of the hosts users install on.
PLATFORMS = [
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("darwin", "x86_64"),
    ("win32", "AMD64"),
    ("win32", "ARM64"),
]


@pytest.mark.parametrize("platform", PLATFORMS, ids="-".join)
def test_exactly_one_onnx_runtime_build_installs_on_every_platform(
    platform: tuple[str, str],
) -> None:
    system, machine = platform
    environment = {"sys_platform": system, "platform_machine": machine, "python_version": "3.11"}
    chosen = [
        r.name
        for r in runtime_requirements()
        if r.name in ("onnxruntime", "onnxruntime-gpu")
        and (r.marker is None or r.marker.evaluate(environment))
    ]
    # Both install the module `onnxruntime`; together they overwrite each other's files.
    assert len(chosen) == 1, f"{platform}: {chosen}"


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_each_lock_pins_every_runtime_dependency_and_one_onnx_runtime(variant: str) -> None:
    pins = locked(variant)
    for requirement in runtime_requirements():
        if requirement.name.startswith("onnxruntime"):
            continue
        assert requirement.name in pins, f"{variant}.txt lacks {requirement.name}: make lock"
        assert requirement.specifier.contains(pins[requirement.name]), (
            f"{variant}.txt pins {requirement.name}=={pins[requirement.name]}, pyproject.toml "
            f"wants {requirement.specifier}: make lock"
        )
    runtime = {"cpu": "onnxruntime", "gpu": "onnxruntime-gpu"}[variant]
    other = {"cpu": "onnxruntime-gpu", "gpu": "onnxruntime"}[variant]
    assert runtime in pins and other not in pins, sorted(pins)
    # The project is installed without build isolation: its build backend comes from the lock.
    backend = Requirement(pyproject()["build-system"]["requires"][0])
    assert backend.specifier.contains(pins[backend.name])
