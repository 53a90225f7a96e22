"""The docs site's generated pages (ops/tools/reference_pages.py) match the code: every option
of the four configured commands is on the configuration page as declared, with the environment
variable and default its `--help` states, and `--help` lists exactly the flags of the page; every
metric is on the metrics page."""

from __future__ import annotations

import re

from ops.tools import reference_pages
from ops.tools.reference_pages import ROOT
from tests.deploy.repo import metric_families


def test_the_committed_pages_are_what_the_code_generates() -> None:
    assert reference_pages.stale_pages() == [], (
        "regenerate them: .venv/bin/python -m ops.tools.reference_pages"
    )


def test_the_configuration_page_and_help_list_exactly_the_declared_settings() -> None:
    page = reference_pages.configuration_page()
    parsers = dict(reference_pages._commands())
    for name, declared in reference_pages.CONFIGURED:
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        printed = parsers[name].format_help()
        # --help wraps at hyphens too ("comma-" / "separated"): compare without whitespace.
        help_text = "".join(printed.split())
        settings = declared.settings()
        rows = re.findall(r"^\| (`-[^|]+) \| `([A-Z0-9_]+)` \| `([^`]*)` \|", section, flags=re.M)
        assert [(env, default) for _, env, default in rows] == [
            (s.env, s.default.replace(str(ROOT), "<installation>")) for s in settings
        ], f"{name}: the page's settings are not the declared ones"
        assert set(re.findall(r"\[env([A-Z0-9_]+);", help_text)) == {s.env for s in settings}, (
            f"{name}: --help's environment variables are not the declared ones"
        )
        for setting in settings:
            default = "".join(setting.default.replace(str(ROOT), "<installation>").split())
            assert f"[env{setting.env};default:{default}]" in help_text, (
                f"{name}: {setting.env}'s default {setting.default!r}"
            )
        listed = set(re.findall(r"^  (-[A-Za-z]|--[a-z0-9-]+)", printed, flags=re.M))
        listed |= set(re.findall(r"^  -[A-Za-z] \S+, (--[a-z0-9-]+)", printed, flags=re.M))
        listed -= {"-h", "--help"}
        on_page = set(re.findall(r"`(--?[A-Za-z][a-z0-9-]*)`", section))
        assert listed == on_page, (
            f"{name}: --help lists {sorted(listed - on_page)} besides the page's flags, the "
            f"page {sorted(on_page - listed)} besides --help's"
        )


def test_every_metric_is_on_the_metrics_page() -> None:
    page = reference_pages.metrics_page()
    for name, (kind, labels) in metric_families().items():
        shown = name + "_total" if kind == "counter" else name
        row = next((line for line in page.splitlines() if line.startswith(f"| `{shown}` |")), None)
        assert row is not None, f"{shown} is not on the metrics page"
        assert all(f"`{label}`" in row for label in labels), f"{shown}: labels {labels}"
