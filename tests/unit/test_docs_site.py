"""The README's links resolve in the docs site: each names a file of the repository, each link
into docs/ a page of the site's navigation (mkdocs.yml), and each #anchor a heading of that page.
Links between the site's own pages are checked by `mkdocs build --strict` (make check)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _nav_pages(nav: list[Any]) -> Iterator[str]:
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {_slug(heading) for heading in headings}


def test_the_readme_links_to_pages_and_headings_the_site_has() -> None:
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    links = [link for link in LINK.findall((ROOT / "README.md").read_text())]
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert any(link.startswith("docs/") for link in local), "the README links to no page"
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README links to {path}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):  # a page, not an image
            assert target.relative_to(DOCS).as_posix() in nav, f"{path} is not in mkdocs.yml's nav"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading"


def test_every_page_of_docs_is_in_the_navigation() -> None:
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}
    assert pages == nav, f"in docs/ only: {sorted(pages - nav)}; in nav only: {sorted(nav - pages)}"


def test_the_readme_stays_a_front_page() -> None:
    # Everything else belongs on the site: the README is what a newcomer reads first.
    assert len((ROOT / "README.md").read_text().splitlines()) < 200
