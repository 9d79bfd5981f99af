"""``bench leaderboard --export-space DIR``: a deployable Hugging Face Space of the leaderboard; what it holds:
``docs/leaderboard.md``, "Hosting: a Hugging Face Space". Push it with ``hf upload ORG/NAME DIR . --repo-type space``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from genshift.errors import BenchError
from genshift.leaderboard import STREAMLIT

REQUIREMENTS = ("streamlit", "plotly", "pandas", "numpy", "pyarrow", "scipy", "huggingface_hub", "cryptography",
                "pyyaml", "pillow", "pydantic")
APP = '''"""Hugging Face Space entry point: the genshift-bench leaderboard (what it shows: space.json)."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL = {wheel!r}  # built from the checkout this Space was exported from; its dependencies: requirements.txt
try:
    installed = metadata.version("genshift-bench")
except metadata.PackageNotFoundError:
    installed = None
if WHEEL and installed != {version!r}:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", str(HERE / WHEEL)], check=True)

from genshift.leaderboard import Settings  # noqa: E402
from genshift.leaderboard.ui import main  # noqa: E402

main(Settings.loads((HERE / "space.json").read_text(), base=HERE))
'''
TAGS = ("leaderboard", "submission:semiautomatic", "test:public", "judge:auto", "modality:image")


def _package(into: Path) -> tuple[str | None, str]:
    """``(wheel file name, requirement)``: a wheel of the checkout ``genshift`` is imported from (built from its
    package folders only), or, for an installed release, no wheel and the release pinned."""
    import tomllib

    import genshift

    src = Path(genshift.__file__).resolve().parent.parent  # a checkout: the folder of pyproject.toml
    if not (src / "pyproject.toml").is_file():
        return None, f"genshift-bench=={metadata.version('genshift-bench')}"
    with tempfile.TemporaryDirectory() as tmp:
        folders = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(src / name, tmp)
        for folder in set(folders):
            shutil.copytree(src / folder, Path(tmp) / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                              "-w", str(into), tmp], capture_output=True, text=True)
    wheels = sorted(into.glob("genshift_bench-*.whl"))
    if run.returncode or not wheels:
        raise BenchError(f"building the genshift-bench wheel from {src} failed: {run.stderr.strip()[-300:]}")
    return wheels[0].name, ""


def export_space(out: str | Path, settings) -> Path:
    """Write the Space folder for ``settings`` (``genshift.leaderboard.Settings``; a Hub store's ``results``
    pinned ``ORG/NAME@sha``) under a temporary name, then rename it: never half-written."""
    from genshift.fsutil import INCOMPLETE

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BenchError(f"{out} exists and is not empty; give a new folder for the Space")
    try:
        pins = [f"{name}=={metadata.version(name)}" for name in REQUIREMENTS]
    except metadata.PackageNotFoundError as e:
        raise BenchError(f"{e.name} is not installed here, so its version cannot be pinned; "
                         "pip install 'genshift-bench[leaderboard]' first") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=INCOMPLETE, dir=out.parent))
    try:
        wheel, requirement = _package(tmp)
        copies = {}  # setting -> its copy in the Space
        for key, name, copy in (("results", "results", _copy_store), ("trusted_keys", "trusted_keys", shutil.copyfile),
                                ("id_accuracy", "id_accuracy.csv", shutil.copyfile),
                                ("suites", "suites", _copy_trusted_manifests)):
            src = getattr(settings, key)
            if src and (key != "results" or Path(src).is_dir()):  # a Hub store is pinned, never copied
                copy(Path(src), tmp / name)
                copies[key] = name
        (tmp / "space.json").write_text(json.dumps(json.loads(replace(settings, **copies).dumps()), indent=1) + "\n")
        (tmp / "app.py").write_text(APP.format(wheel=wheel, version=metadata.version("genshift-bench")))
        (tmp / "requirements.txt").write_text("\n".join(pins + [requirement] if requirement else pins) + "\n")
        repo, _, sha = settings.results.partition("@")
        (tmp / "README.md").write_text(Path(__file__).with_name("space_card.md").read_text().format(
            quoted_title=json.dumps(settings.title), title=settings.title, tags="\n".join(f"  - {t}" for t in TAGS),
            streamlit_version=metadata.version("streamlit"), pinned=f"commit `{sha}` of `{repo}`" if sha else
            "the results copied into this Space (`results/`)"))
        (tmp / ".streamlit").mkdir()
        (tmp / ".streamlit" / "config.toml").write_text("\n".join(
            f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in opts.items())
            for section, opts in STREAMLIT.items()))
        tmp.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _copy_store(src: Path, dst: Path) -> None:
    """Every entry's files a board reads (result, record, diagnose report, the predictions the result names)."""
    from genshift.leaderboard.store import DIAGNOSE, RESULT_FILE, STAMP

    for run in sorted(p.parent for p in src.glob(f"*/*/{RESULT_FILE}")):
        for f in [run / RESULT_FILE, run / STAMP, run / DIAGNOSE, *sorted(run.glob("predictions/*.parquet"))]:
            if f.is_file():
                (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst / f.relative_to(src))


def _copy_trusted_manifests(src: Path, dst: Path) -> None:
    """The trusted suites' manifests only (no data), each as ``<manifest sha256>.json``, bytes unchanged
    (the sha256 a result records is of these bytes)."""
    from genshift.eval.suite_trust import TrustedSuites
    from genshift.fsutil import sha256_file
    from genshift.suite_format import MANIFEST

    TrustedSuites.from_paths([src], registry=False)  # every file parses as a manifest, else one error line
    files = [src / MANIFEST] if (src / MANIFEST).is_file() else \
        [c / MANIFEST if c.is_dir() else c for c in sorted(src.iterdir())
         if c.is_dir() and (c / MANIFEST).is_file() or c.is_file() and c.suffix == ".json"]
    dst.mkdir()
    for f in files:
        shutil.copyfile(f, dst / f"{sha256_file(f)}.json")
