"""Regenerate ``benchmark/_data/imagenet_star_61.yaml``: the ImageNet* population as timm 0.6.12 loaded it.

For each of the authors' 61 plain timm names (Feb. 2023, timm 0.6.12) this reads 0.6.12's own
``default_cfgs`` (from its wheel, in a subprocess) and records the weights URL it loaded, the data config
it resolved (``resolve_data_config(use_test_size=True)``, as its ``validate.py``) and today's tag holding
those weights, by the first rule that applies (``matched_by``): ``url`` (the same URL), ``url-resaved``
(the same up to the hash suffix: torchvision re-saved ``resnet18-5c106cde.pth``), ``deprecation`` (the
weights moved to the Hub and timm's deprecation table maps the name) or ``default-tag`` (as before,
the tag the plain name loads today). ``tests/test_populations.py`` re-derives the file.

    pip download timm==0.6.12 --no-deps -d /tmp/timm0612
    python scripts/pin_imagenet_star.py --wheel /tmp/timm0612/timm-0.6.12-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "benchmark" / "_data" / "imagenet_star_61.yaml"
# the 0.6.12 modules that define the 61 names
MODULES = ("resnet", "convnext", "vision_transformer", "deit", "mobilevit", "mlp_mixer", "efficientnet", "beit")
DATA_KEYS = ("input_size", "crop_pct", "interpolation", "mean", "std")

# Runs in a fresh interpreter with the unpacked wheel's folder as argv[1]: imports only the model
# modules (0.6.12's timm/__init__ imports every model, and maxxvit's dataclasses fail on Python 3.11).
_READ_OLD = r"""
import importlib, json, sys, types, warnings
warnings.simplefilter("ignore")
root, names, modules = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for name, sub in (("timm", ""), ("timm.models", "/models")):
    pkg = types.ModuleType(name)
    pkg.__path__ = [root + "/timm" + sub]
    sys.modules[name] = pkg
sys.modules["timm"].__version__ = "0.6.12"
cfgs = {}
for m in modules:
    cfgs.update(importlib.import_module("timm.models." + m).default_cfgs)
from timm.data.config import resolve_data_config
out = {n: {"url": cfgs[n]["url"], "data_config": resolve_data_config({}, default_cfg=cfgs[n], use_test_size=True)}
       for n in names}
print(json.dumps(out))
"""


def read_old(wheel: str | Path, names: list[str]) -> dict[str, dict]:
    """``{name: {"url", "data_config"}}`` from timm 0.6.12's own source (the wheel file)."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.unpack_archive(wheel, tmp, "zip")
        version = next(Path(tmp).glob("timm-*.dist-info")).name
        if not version.startswith("timm-0.6.12."):
            raise SystemExit(f"{wheel} is {version}, not timm 0.6.12")
        proc = subprocess.run([sys.executable, "-c", _READ_OLD, tmp, json.dumps(names), json.dumps(MODULES)],
                              capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"reading timm 0.6.12 failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout)  # (tuples came back as lists)
    return {n: {**v, "data_config": {k: x for k, x in v["data_config"].items() if k in DATA_KEYS}}
            for n, v in out.items()}


def _unhashed(url: str) -> str:
    return re.sub(r"-[0-9a-f]{8}(\.pth)$", r"\1", url)


def match_tag(name: str, url: str) -> tuple[str, str]:
    """(today's tag, rule) of the weights 0.6.12 loaded for ``name`` from ``url`` (module docstring)."""
    import timm
    from timm.models import get_pretrained_cfg
    from timm.models._registry import _deprecated_models

    tags = [t for t in timm.list_pretrained() if get_pretrained_cfg(t).num_classes == 1000]
    urls = {t: get_pretrained_cfg(t).url or "" for t in tags}
    for rule, same in (("url", lambda u: u == url), ("url-resaved", lambda u: u and _unhashed(u) == _unhashed(url))):
        hits = [t for t, u in urls.items() if same(u)]
        if len(hits) == 1:
            return hits[0], rule
        if len(hits) > 1:
            raise SystemExit(f"{name}: {len(hits)} tags hold {url}: {hits}")
    successor = _deprecated_models.get(name)
    arch = (successor or name).split(".")[0]
    if any(u for t, u in urls.items() if t.split(".")[0] == arch):
        raise SystemExit(f"{name}: no tag of {arch} holds {url}, but some record another URL; check by hand")
    if successor:
        return successor, "deprecation"
    return f"{arch}.{get_pretrained_cfg(arch).tag}", "default-tag"


def derive(wheel: str | Path, names: list[str]) -> list[dict]:
    """The data file's entries for ``names`` (models.txt order)."""
    old = read_old(wheel, names)
    out = []
    for n in names:
        tag, rule = match_tag(n, old[n]["url"])
        out.append({"paper": n, "model": tag, "role": "fit", "matched_by": rule, "url": old[n]["url"],
                    "data_config": old[n]["data_config"]})
    return out


def read_names(path: Path = OUT) -> list[str]:
    import yaml

    return [m["paper"] for m in yaml.safe_load(path.read_text())["models"]]


def render(entries: list[dict]) -> str:
    head = ["# Generated by scripts/pin_imagenet_star.py from timm 0.6.12's own default_cfgs; do not edit by hand.",
            "# paper: the authors' models.txt name; model: today's timm tag holding the weights 0.6.12 loaded",
            "# (matched_by: the rule, see the script); url: those weights; data_config: what 0.6.12 resolved",
            "# (resolve_data_config(use_test_size=True), as its validate.py).",
            "timm: 0.6.12", "models:"]
    return "\n".join(head + [f"  - {json.dumps(e)}" for e in entries]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", required=True, help="timm-0.6.12-py3-none-any.whl (pip download timm==0.6.12 --no-deps)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    Path(args.out).write_text(render(derive(args.wheel, read_names())))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
