"""The project's docs stand alone: every relative link and every file path they name is in the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("benchmark", "benchmarks", "builders", "data_cards", "docs", "eval", "leaderboard", "scripts", "tests")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PATH = re.compile(r"`((?:{})/[A-Za-z0-9_./-]*\.[A-Za-z0-9]+)`".format("|".join(TOP)))


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve_inside_the_repository(doc):
    text = doc.read_text()
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # an absolute URL or an anchor in the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or ROOT not in path.parents and path != ROOT:
            bad.append(target)
    for target in PATH.findall(text):
        if not (ROOT / target).exists():
            bad.append(target)
    assert not bad, f"{doc.name} names files that are not in the repository: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_docs_cite_nothing_outside_the_repository(doc):
    text = doc.read_text()
    for outside in ("specs/", "shared/", "Lent GPU"):
        assert outside not in text, f"{doc.name} mentions {outside!r}, which is not part of the repository"


def test_code_comments_cite_no_specs():
    """Docstrings and comments cite the papers and the project's docs, not notes outside the repository."""
    hits = [str(p.relative_to(ROOT)) for top in TOP for p in (ROOT / top).rglob("*")
            if p.suffix in (".py", ".yaml", ".md", ".j2") and p.name != "test_docs.py" and "specs/" in p.read_text()]
    assert not hits, f"files citing specs/: {hits}"


def test_readme_lists_every_verb():
    from genshift.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    verbs = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    missing = [v for v in verbs if f"`bench {v}" not in readme]
    assert not missing, f"README's verb table lacks {missing}"
