"""``bench leaderboard --export-space DIR``: a deployable Hugging Face Space of the leaderboard.

The folder holds everything the Space needs and nothing it would have to fetch besides the
pinned results and the pinned packages:

- ``README.md``: the Space card, front matter ``sdk: streamlit`` with the Streamlit version and
  ``app_file: app.py``;
- ``app.py``: runs the leaderboard app (``pkg/genshift/leaderboard/app.py``) with the settings below;
- ``pkg/genshift/``: this version's ``genshift`` core, ``genshift.eval`` and ``genshift.leaderboard`` (source and
  package data only);
- ``requirements.txt``: the leaderboard's dependencies pinned to the versions it was exported with;
- ``space.json``: the results repo **pinned to a commit sha**, and the file names below;
- ``trusted_keys`` (and ``id_accuracy.csv``): copies of the files given;
- ``.streamlit/config.toml``: viewer mode (``client.toolbarMode = "viewer"``: no developer menu,
  no Deploy button; ``client.disableDataExport``: no grid CSV export, the app's own downloads are
  formula-safe), headless, no usage statistics.

Push it with ``huggingface-cli upload --repo-type space ORG/NAME DIR .`` (``docs/leaderboard.md``).
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

from genshift.errors import BenchError

# the parts of the genshift package the app imports, and where each goes in the Space
PACKAGES = {"genshift": "genshift", "genshift.eval": "genshift/eval", "genshift.leaderboard": "genshift/leaderboard"}
REQUIREMENTS = ("streamlit", "plotly", "pandas", "numpy", "pyarrow", "scipy", "huggingface_hub", "datasets",
                "pyyaml", "pillow", "cryptography", "tqdm", "pydantic")
STREAMLIT_CONFIG = """[client]
toolbarMode = "viewer"
disableDataExport = true
showErrorDetails = "none"

[server]
headless = true
runOnSave = false

[browser]
gatherUsageStats = false
"""
APP = '''"""Hugging Face Space entry point: the genshift-bench leaderboard over the pinned results repo."""

import json
import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pkg"))
config = json.loads((HERE / "space.json").read_text())
os.environ["GENSHIFT_RESULTS"] = config["results"]
for key, env in (("trusted_keys", "GENSHIFT_TRUSTED_KEYS"), ("id_accuracy", "GENSHIFT_ID_ACCURACY"),
                 ("suites", "GENSHIFT_SUITES")):
    if config.get(key):
        os.environ[env] = str(HERE / config[key])
    else:
        os.environ.pop(env, None)
if __name__ == "__main__":  # a worker of the store check (spawn) imports this file as "__mp_main__": no app there
    runpy.run_path(str(HERE / "pkg" / "genshift" / "leaderboard" / "app.py"), run_name="__main__")
'''


def _pins() -> list[str]:
    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise BenchError(f"{name} is not installed here, so its version cannot be pinned; "
                             "pip install 'genshift-bench[leaderboard]' first") from None
    return out


def card(results: str, *, title: str) -> str:
    from streamlit import __version__ as streamlit_version

    return f"""---
title: {json.dumps(title)}
emoji: 📊
colorFrom: indigo
colorTo: green
sdk: streamlit
sdk_version: {streamlit_version}
app_file: app.py
pinned: false
---

# {title}

Robustness of ImageNet classifiers to generated distribution shifts (genshift-bench). Every number
is recomputed from the stored per-image predictions of the results repository, pinned to commit
`{results.partition("@")[2]}` of `{results.partition("@")[0]}`; an entry counts as verified only when a
maintainer key listed in `trusted_keys` signed its verification stamp.

To update the board, export the Space again at the new results commit and push it.
"""


def export_space(out: str | Path, *, results: str, revision: str | None, trusted_keys: str | None = None,
                 id_accuracy: str | None = None, suites: str | None = None,
                 title: str = "genshift-bench leaderboard") -> Path:
    """Write the Space folder (temp name + rename: never half-written). ``results`` is a Hub dataset repo
    ``ORG/NAME`` resolved to ``revision`` (a commit sha); a local folder cannot be served by a Space."""
    repo = results.partition("@")[0]
    if revision is None or repo.count("/") != 1 or Path(results).exists():
        raise BenchError("--export-space needs --results ORG/NAME[@sha] of a Hub dataset repo (a Space cannot read "
                         "a local folder); push the results first")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BenchError(f"{out} exists and is not empty; give a new folder for the Space")
    pins = _pins()
    import importlib.util
    import tempfile

    from genshift.fsutil import INCOMPLETE

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=INCOMPLETE, dir=out.parent))
    try:
        for pkg, dst in PACKAGES.items():
            src = Path(importlib.util.find_spec(pkg).origin).parent
            shutil.copytree(src, tmp / "pkg" / dst, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", ".*", "cli"))
        config = {"results": f"{repo}@{revision}", "trusted_keys": None, "id_accuracy": None, "suites": None}
        if trusted_keys:
            from genshift.eval.stamps import load_trusted_keys

            load_trusted_keys(trusted_keys)  # a bad keys file fails here, not in the Space
            shutil.copyfile(trusted_keys, tmp / "trusted_keys")
            config["trusted_keys"] = "trusted_keys"
        if id_accuracy:
            from genshift.leaderboard.aggregate import read_id_accuracy

            read_id_accuracy(id_accuracy)
            shutil.copyfile(id_accuracy, tmp / "id_accuracy.csv")
            config["id_accuracy"] = "id_accuracy.csv"
        if suites:
            _copy_trusted_manifests(Path(suites), tmp / "suites")
            config["suites"] = "suites"
        (tmp / "space.json").write_text(json.dumps(config, indent=1) + "\n")
        (tmp / "app.py").write_text(APP)
        (tmp / "requirements.txt").write_text("\n".join(pins) + "\n")
        (tmp / "README.md").write_text(card(config["results"], title=title))
        (tmp / ".streamlit").mkdir()
        (tmp / ".streamlit" / "config.toml").write_text(STREAMLIT_CONFIG)
        tmp.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


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
