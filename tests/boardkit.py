"""What the board's tests share: a synthetic board, the real page under Streamlit's AppTest, its tables and
downloads (``tests/test_board_*.py``)."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.synthetic_store import make_store, sign_entry, write_model

CONFIGS = ["base", "shift_01", "shift_02"]


def page(settings: str):
    """The page as an AppTest script (``AppTest.from_function``): its settings as JSON."""
    from genshift.leaderboard import Settings
    from genshift.leaderboard.ui import main

    main(Settings.loads(settings))


def app(results, *, trusted_keys=None, suites=None, id_accuracy=None, hub_results=False, query=None, run=True):
    """The real page over ``results`` (a folder or ``ORG/NAME@sha``), opened with ``query`` in its URL."""
    from streamlit.testing.v1 import AppTest

    from genshift.leaderboard import Settings

    s = Settings(results=str(results), trusted_keys=str(trusted_keys) if trusted_keys else None,
                 suites=str(suites) if suites else None, id_accuracy=str(id_accuracy) if id_accuracy else None,
                 hub_results=hub_results)
    at = AppTest.from_function(page, args=(s.dumps(),), default_timeout=120)
    for k, v in (query or {}).items():
        at.query_params[k] = v
    return at.run() if run else at


def key_of(root: Path) -> Path:
    return root.parent / f"{root.name}.key"


def board(root: Path, *, models: int = 8, extra=(), signed: bool = True, rows: int = 60) -> Path:
    """A board of ``models`` synthetic models, two of them tied exactly (``timm/tie_a.in1k``, ``timm/tie_b.in1k``),
    plus ``extra`` (model_id, write_model keywords) entries; every entry signed with :func:`key_of` unless not
    ``signed``. Its trusted keys file: ``f"{key_of(root)}.pub"``."""
    make_store(root, models=models, configs=len(CONFIGS), rows=rows, seed=3)
    for mid in ("timm/tie_a.in1k", "timm/tie_b.in1k"):  # same rng, same skill: identical predictions
        write_model(root, model_id=mid, architecture="resnet18", tag="in1k", num_params=11e6, skill=1.0,
                    rng=np.random.default_rng(42), **common(root))
    for mid, kw in extra:
        write_model(root, model_id=mid, rng=np.random.default_rng(7), **{**common(root), **kw})
    if signed:
        sign_all(root)
    return root


def common(root: Path) -> dict:
    """write_model's suite arguments for another entry on ``root``'s board (the same images, in the same order)."""
    first = json.loads(next(root.glob("*/*/result.json")).read_text())
    n = first["predictions"][0]["rows"]
    configs = first["suite"]["configs"]
    return dict(suite_id=first["suite"]["id"], configs=configs, manifest=first["suite"]["manifest_sha256"],
                difficulty={c: np.zeros(n) for c in configs})


def sign_all(root: Path) -> None:
    for p in sorted(root.glob("*/*/result.json")):
        sign_entry(p, key_of(root))


def move(result: Path, folder: Path) -> Path:
    """The entry of ``result`` moved to ``folder`` (e.g. a folder its result does not name)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(result.parent), str(folder))
    return folder / "result.json"


def grid(at, which: str):
    """The official ranking ("main": its first column is the rank) or the community table ("community": its rows
    say why they are not ranked); None if not drawn."""
    want = {"main": lambda c: c[0] == "rank", "community": lambda c: "not_ranked_because" in c}[which]
    return next((d.value for d in at.dataframe if want(list(d.value.columns))), None)


def table(at, column: str):
    """The first dataframe of the page with ``column``."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def texts(at) -> list[str]:
    return [t.value for t in at.text]


def download(at, key: str) -> bytes:
    """What a download button gives when clicked (the page makes its files when clicked)."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    button = next(b for b in at.get("download_button") if b.proto.id.endswith(key))
    for obj in gc.get_objects():
        if type(obj) is MediaFileManager and button.proto.deferred_file_id in obj._deferred_callables:
            data = obj._deferred_callables[button.proto.deferred_file_id]["callable"]()
            return data.encode() if isinstance(data, str) else data
    raise AssertionError("deferred download not found")


def chrome() -> bool:
    return bool(shutil.which("chromium") and shutil.which("chromedriver"))


@pytest.fixture(autouse=True)
def fresh_caches():
    """Streamlit's caches (and the page's stale marks) start empty in every test that imports this fixture."""
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    yield
