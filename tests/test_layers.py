"""The import graph of the installed ``genshift`` package: data flows one way (issue 33, docs/design).

Every module of the installed package is parsed (never imported) and every ``import`` in it, at the
top or inside a function, is an arrow. The layers, from the bottom:

- ``core``: ``genshift.*`` in ``benchmark/`` (the format, the registry, Hub I/O, the label space, the
  families); imports no other layer;
- ``data_cards``: card templates; a leaf that imports nothing of genshift (callers pass it a manifest);
- ``eval``: inference, metrics, results, verification; imports the core;
- ``builders``: imports the core, the model loader and the metrics of eval (``eval.models``,
  ``eval.metrics``) and the card templates;
- ``leaderboard``: imports eval and the core;
- ``cli`` (``genshift.cli``, ``python -m genshift``): may import anything; nothing imports it.

Arrows that other helpers are removing in this round are marked ``xfail(strict=True)``: the test
turns red the day they are gone, so the mark goes with them.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

import pytest

PACKAGES = ("genshift", "genshift.eval", "genshift.builders", "genshift.leaderboard", "genshift.data_cards")
LAYER_OF = {"genshift.cli": "cli", "genshift.__main__": "cli", "genshift.eval": "eval", "genshift.builders": "builders",
            "genshift.leaderboard": "leaderboard", "genshift.data_cards": "data_cards"}
ALLOWED = {  # layer -> the layers it may import (besides itself)
    "core": set(),
    "data_cards": set(),
    "eval": {"core"},
    "builders": {"core", "eval", "data_cards"},
    "leaderboard": {"core", "eval"},
    "cli": {"core", "eval", "builders", "leaderboard", "data_cards"},
}
BUILDERS_MAY_IMPORT = ("genshift.eval.models", "genshift.eval.metrics")  # one model loader, one set of metrics


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    out = {}
    for package in PACKAGES:
        (root,) = importlib.util.find_spec(package).submodule_search_locations
        for path in sorted(Path(root).rglob("*.py")):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            out.setdefault(".".join([package, *parts]), path)
    return out


def layer(module: str) -> str:
    for prefix, name in LAYER_OF.items():
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "core"


def _resolve(target: str) -> str | None:
    """The module an import names (``from genshift import imagenet`` -> ``genshift.imagenet``)."""
    while target and target not in modules():
        target = target.rpartition(".")[0]
    return target or None


@lru_cache(maxsize=1)
def arrows() -> dict[str, dict[str, int]]:
    """module -> {imported genshift module: line of the first such import}."""
    out = {}
    for name, path in modules().items():
        found: dict[str, int] = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, or node.level - 1 packages up
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t.split(".")[0] != "genshift":
                    continue
                resolved = _resolve(t)
                assert resolved is not None, f"{name}:{node.lineno} imports {t}, which is no module of genshift"
                if resolved != name:
                    found.setdefault(resolved, node.lineno)
        out[name] = found
    return out


def _violations(of_layer: str, graph: dict[str, dict[str, int]] | None = None) -> list[str]:
    bad = []
    for name, targets in sorted((graph or arrows()).items()):
        if layer(name) != of_layer:
            continue
        for target, line in sorted(targets.items()):
            to = layer(target)
            if to == of_layer or to in ALLOWED[of_layer] and not (
                    of_layer == "builders" and to == "eval" and target not in BUILDERS_MAY_IMPORT):
                continue
            bad.append(f"{name}:{line} -> {target} ({of_layer} -> {to})")
    return bad


def test_every_module_is_seen():
    names = set(modules())
    assert {"genshift.suite_format", "genshift.cli", "genshift.eval.verify", "genshift.builders",
            "genshift.leaderboard.store", "genshift.data_cards"} <= names
    assert set(map(layer, names)) == set(ALLOWED)


@pytest.mark.parametrize("of_layer", ["core", "data_cards", "eval", "leaderboard", "cli", "builders"])
def test_layers_import_only_the_layers_below(of_layer):
    bad = _violations(of_layer)
    assert not bad, f"{len(bad)} arrow(s) against the layering:\n" + "\n".join(bad)


def _cycles(within: str, graph: dict[str, dict[str, int]] | None = None) -> list[list[str]]:
    """Strongly connected groups of more than one module among ``within``'s modules (Tarjan, iterative)."""
    graph = {m: [t for t in targets if layer(t) == within] for m, targets in (graph or arrows()).items()
             if layer(m) == within}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


@pytest.mark.parametrize("within", ["core", "data_cards", "eval", "builders", "leaderboard", "cli"])
def test_no_import_cycles(within):
    """Layers cannot form cycles (the arrows above point one way); neither may modules inside a layer."""
    assert _cycles(within) == []


def test_hub_layers_inside_the_core():
    """hubio (transport) <- upstream (the release adapter) <- hub (open, download, publish suites)."""
    assert "genshift.hub" not in arrows()["genshift.upstream"]
    assert not {"genshift.hub", "genshift.upstream"} & set(arrows()["genshift.hubio"])


def test_a_cycle_and_a_wrong_arrow_are_found():
    """The checks themselves: a made-up cycle and a core module importing eval are reported."""
    fake = {"genshift.a": {"genshift.b": 1}, "genshift.b": {"genshift.a": 2, "genshift.eval.x": 3},
            "genshift.eval.x": {}, "genshift.builders.y": {"genshift.eval.verify": 4, "genshift.eval.models": 5}}
    assert _cycles("core", fake) == [["genshift.a", "genshift.b"]]
    assert _violations("core", fake) == ["genshift.b:3 -> genshift.eval.x (core -> eval)"]
    assert _violations("builders", fake) == ["genshift.builders.y:4 -> genshift.eval.verify (builders -> eval)"]
