"""The leaderboard: store checks, aggregation, the Streamlit app under AppTest, and a real browser."""

import gc
import io
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from genshift.leaderboard import aggregate
from genshift.leaderboard.store import load_store
from genshift.leaderboard.synthetic import ARCHS, make_store, write_model

APP = os.path.join(os.path.dirname(__file__), "..", "leaderboard", "app.py")
XSS = "<script>alert(1)</script>"


@pytest.fixture(autouse=True)
def clear_streamlit_caches():
    import streamlit as st
    st.cache_data.clear()
    st.cache_resource.clear()
    yield


@pytest.fixture
def store_dir(tmp_path):
    """6 models x 4 configs + special entries: XSS name, tampered, duplicate, bad schema, construction, one
    unverified entry. Every honest entry but ``timm/community.model`` and the old duplicate carries a
    maintainer's signed stamp (the key is in ``GENSHIFT_TRUSTED_KEYS``)."""
    root = tmp_path / "store"
    make_store(root, models=6, configs=4, rows=60, seed=1)
    rng = np.random.default_rng(5)
    difficulty = {c: np.random.default_rng(1).normal(0, 1.2, 60) for c in ["base", "shift_01", "shift_02", "shift_03"]}
    configs = list(difficulty)  # same image ids as make_store's entries, so rank intervals can pair them
    first = json.loads(next(root.glob("*/*/result.json")).read_text())
    common = dict(suite_id="imagenet-star", configs=configs, difficulty=difficulty, rng=rng,
                  manifest=first["suite"]["manifest_sha256"])
    write_model(root, model_id=XSS, architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=3.0,
                notes="[click](javascript:alert(1)) **bold**", **common)
    tampered = write_model(root, model_id="timm/tampered.model", architecture="resnet50", tag="a1_in1k",
                           num_params=25e6, skill=2.0, **common)
    p = tampered.parent / "predictions" / "shift_01.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(p)
    t = t.set_column(t.schema.get_field_index("true_rank"), "true_rank", pa.array(np.zeros(t.num_rows, np.int32)))
    pq.write_table(t, p)
    bad = root / "imagenet-star" / "future--model" / "result.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"kind": "genshift-result", "schema_version": 2}))
    dup_old = write_model(root / "old", model_id="timm/resnet50.a1_in1k-v0", architecture="resnet50", tag="a1_in1k",
                          num_params=25e6, skill=-1.0, finished_at="2020-01-01T00:00:00+00:00", **common)
    shutil.move(str(dup_old.parent), str(root / "imagenet-star" / "timm--resnet50.a1_in1k-v0-old"))
    shutil.rmtree(root / "old")
    write_model(root, model_id="timm/resnet50.tv_in1k", architecture="resnet50", tag="tv_in1k", num_params=25e6,
                skill=0.5, flags={"construction_model": True}, **common)
    for p in root.glob("imagenet-star/*/result.json"):
        if p.parent.name not in ("timm--tampered.model", "future--model", "timm--resnet50.a1_in1k-v0-old"):
            _sign_stamp(p, tmp_path / "maintainer.key")
    write_model(root, model_id="timm/community.model", architecture="resnet50", tag="a1_in1k", num_params=25e6,
                skill=4.0, **common)  # the best numbers on the board, but unverified: never ranked
    os.environ["GENSHIFT_TRUSTED_KEYS"] = str(tmp_path / "maintainer.key.pub")
    return root


VERIFIED = sorted([f"timm/{a}.{t}-v{i}" for i, (a, t, _) in enumerate(ARCHS)] + [XSS, "timm/resnet50.tv_in1k"])


def _sign_stamp(result_path, key_path):
    """A maintainer's signed stamp for a synthetic entry (no model to re-run; the format of `bench verify --sign`)."""
    from genshift.leaderboard.synthetic import sign_entry
    sign_entry(result_path, key_path)


def test_store_rejects_and_supersedes_with_reasons(store_dir):
    store = load_store(str(store_dir), trusted_keys=os.environ["GENSHIFT_TRUSTED_KEYS"])
    reasons = {e.path.parent.name: e.reason for e in store.rejected}
    assert "does not verify" in reasons["timm--tampered.model"]
    assert "predictions/shift_01.parquet sha256" in reasons["timm--tampered.model"]
    assert "schema_version 2 is not supported" in reasons["future--model"]
    # an older copy of a model filed under a folder of its own is refused: a folder belongs to one (suite, model)
    assert "belongs under imagenet-star/timm--resnet50.a1_in1k-v0/" in reasons["timm--resnet50.a1_in1k-v0-old"]
    assert store.superseded == []
    models = {e.model_id: e for e in store.entries}
    assert XSS in models and "timm/tampered.model" not in models
    assert models["timm/resnet50.a1_in1k-v0"].verified  # the verified one wins
    assert sorted(m for m, e in models.items() if e.verified) == VERIFIED


def test_results_on_another_suite_revision_are_never_mixed(store_dir):
    rng = np.random.default_rng(9)
    difficulty = {c: np.random.default_rng(1).normal(0, 1.2, 60) for c in ["base", "shift_01", "shift_02", "shift_03"]}
    write_model(store_dir, suite_id="imagenet-star", configs=list(difficulty), difficulty=difficulty,
                rng=rng, manifest="b" * 64, model_id="timm/resnet50.a1_in1k-rev2", architecture="resnet50",
                tag="a1_in1k", num_params=25e6, skill=5.0)
    store = load_store(str(store_dir), trusted_keys=os.environ["GENSHIFT_TRUSTED_KEYS"])
    main_board, rev2 = store.boards("imagenet-star")
    assert rev2.startswith("b" * 12)
    # a model on another revision of the suite sits on its own board, never ranked with the main one
    main_ids = [e.model_id for e in store.for_suite("imagenet-star")]
    assert "timm/resnet50.a1_in1k-rev2" not in main_ids and len(main_ids) > 2
    assert all(e.board == main_board for e in store.for_suite("imagenet-star"))
    assert [e.path.parent.name for e in store.for_suite("imagenet-star", rev2)] == ["timm--resnet50.a1_in1k-rev2"]

    at = _app(store_dir).run()
    assert not at.exception
    assert sorted(at.dataframe[0].value["model"]) == sorted(
        e.model_id for e in store.for_suite("imagenet-star") if e.verified and not e.result["flags"]["construction_model"])
    at.selectbox(key="board").select(rev2).run()
    # its one entry is unverified: no ranking, a community table only, and the board says so
    assert any("nothing is ranked" in i.value for i in at.info)
    assert "rank" not in at.dataframe[0].value.columns
    assert list(at.dataframe[0].value["model"]) == ["timm/resnet50.a1_in1k-rev2"]
    shared = _app(store_dir)  # the board is in the URL (bound query parameter)
    shared.query_params["board"] = rev2
    _settle(shared)
    assert list(shared.dataframe[0].value["model"]) == ["timm/resnet50.a1_in1k-rev2"]


def test_a_stamp_that_does_not_match_is_ignored(store_dir):
    verified = next(store_dir.glob("imagenet-star/*efficientnet_b0*/result.json"))
    r = json.loads(verified.read_text())
    r["notes"] = "edited after verification"
    verified.write_text(json.dumps(r, sort_keys=True, indent=1))
    store = load_store(str(store_dir))
    e = next(e for e in store.entries if "efficientnet_b0" in e.model_id)
    assert e.status == "accepted" and not e.verified


def test_aggregation_ranks_fits_and_metadata(store_dir):
    store = load_store(str(store_dir))
    entries = [e for e in store.for_suite("imagenet-star") if not e.result["flags"]["construction_model"]]
    df = aggregate.model_table(entries)
    row = df.set_index("model").loc["timm/vit_base_patch16_224.augreg_in21k_ft_in1k-v1"]
    assert row["family"] == "vit" and row["pretraining"] == "in21k/22k" and row["params_m"] == pytest.approx(86.6)
    assert aggregate.family_of("tf_efficientnet_lite0") == "efficientnet" and aggregate.family_of("deit3_small") == "deit"
    assert aggregate.pretraining_of("fb_ssl_yfcc100m_ft_in1k") == "yfcc100m"
    ranks = aggregate.rank_intervals(entries, family="imagenet_star", configs=["shift_01", "shift_02", "shift_03"])
    best = df.sort_values("mean_shift_acc1", ascending=False)["model"].iloc[0]
    assert ranks[best].rank == 1 and ranks[best].lo == 1
    for r in ranks.values():
        assert r.lo <= r.rank <= r.hi
    fits = aggregate.slope_fits(entries)
    from genshift.eval.slope import slope_table
    assert fits == slope_table([e.result for e in entries])  # the same function as `bench slope`


class _Settling:
    """AppTest whose ``run()`` returns once the background store check has finished (no progress bar)."""

    def __init__(self, at):
        self._at = at

    def __getattr__(self, name):
        return getattr(self._at, name)

    def run(self, **kw):
        return _settle(self._at, **kw)


def _settle(at, timeout: float = 90):
    at = getattr(at, "_at", at)
    deadline = time.time() + timeout
    at.run()
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.3)
        at.run()
    return _Settling(at)


def _app(source, trusted_keys=..., id_accuracy=None):
    """AppTest of the app over ``source``; ``trusted_keys``: a keys file, None for none, or (default) the
    environment as it is (the ``store_dir`` fixture sets it)."""
    from streamlit.testing.v1 import AppTest
    os.environ["GENSHIFT_RESULTS"] = str(source)
    for name, value in (("GENSHIFT_TRUSTED_KEYS", trusted_keys), ("GENSHIFT_ID_ACCURACY", id_accuracy)):
        if value is ...:
            continue
        if value:
            os.environ[name] = str(value)
        else:
            os.environ.pop(name, None)
    return _Settling(AppTest.from_file(APP, default_timeout=120))


def _download(at, key):
    import streamlit.runtime.memory_media_file_storage as mm
    from streamlit.runtime.media_file_manager import MediaFileManager
    button = next(b for b in at.get("download_button") if b.proto.id.endswith(key))
    if button.proto.deferred_file_id:  # made when clicked (the app's downloads are): run it as a click would
        for obj in gc.get_objects():
            if isinstance(obj, MediaFileManager) and button.proto.deferred_file_id in obj._deferred_callables:
                data = obj._deferred_callables[button.proto.deferred_file_id]["callable"]()
                return data.encode() if isinstance(data, str) else data
        raise AssertionError("deferred download not found")
    fid = button.proto.url.rsplit("/", 1)[-1].split(".")[0]
    for obj in gc.get_objects():
        if isinstance(obj, mm.MemoryMediaFileStorage) and fid in obj._files_by_id:
            return obj._files_by_id[fid].content
    raise AssertionError("download content not found")


def _grid(at, key):
    """The official ranking (``main_table``: its first column is the rank) or the community table (its
    rows say why they are not ranked); None if not drawn. AppTest gives dataframes no key."""
    want = {"main_table": lambda c: c[0] == "rank", "community_table": lambda c: "not_ranked_because" in c}[key]
    return next((d.value for d in at.dataframe if want(list(d.value.columns))), None)


def test_app_table_order_filters_downloads_and_drilldown(store_dir):
    at = _app(store_dir).run()
    assert not at.exception
    table = _grid(at, "main_table")
    assert table is at.dataframe[0].value or table.equals(at.dataframe[0].value)  # the ranking comes first
    assert XSS in set(table["model"])  # shown as a plain dataframe cell
    assert "timm/resnet50.tv_in1k" not in set(table["model"])  # construction models hidden by default
    assert sorted(table["model"]) == sorted(set(VERIFIED) - {"timm/resnet50.tv_in1k"})  # only verified entries
    assert list(table["mean_shift_acc1"]) == sorted(table["mean_shift_acc1"], reverse=True)
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    assert list(table.columns[:7]) == ["rank", "model", "mean_shift_acc1", "verified", "partial", "pinned_suite",
                                       "flags"]  # trust columns in the first screen
    community = _grid(at, "community_table")
    assert list(community["model"]) == ["timm/community.model"] and "rank" not in community.columns
    assert community["not_ranked_because"].iloc[0].startswith("not verified")
    # the unverified entry has the best numbers of the board and still holds no rank
    assert community["mean_shift_acc1"].iloc[0] > table["mean_shift_acc1"].max()
    assert any(s.value == "Community entries (not verified, not ranked)" for s in at.subheader)
    cols = json.loads(at.dataframe[0].proto.columns)
    assert cols["mean_shift_acc1"]["type_config"]["format"] == "percent"
    assert table["mean_shift_acc1"].dtype.kind == "f"  # numbers stay numbers
    csv = pd.read_csv(io.BytesIO(_download(at, "download_csv")))
    assert list(csv["model"]) == list(table["model"]) + list(community["model"])
    assert list(csv["rank"].iloc[:len(table)]) == list(table["rank"]) and csv["rank"].iloc[len(table):].isna().all()
    # units in every header: the page's percent, said so
    assert csv["mean_shift_acc1 (%)"].tolist()[:len(table)] == pytest.approx(list(100 * table["mean_shift_acc1"]))
    assert "acc@1/shift_01 (%)" in csv.columns and "model_mean_impact (pp)" in csv.columns
    assert "mean_shift_acc1" not in csv.columns and "params (M)" in csv.columns
    data = json.loads(_download(at, "download_json"))
    assert [d["model"] for d in data] == list(csv["model"]) and "mean_shift_acc1 (%)" in data[0]

    at.multiselect(key="family").select("vit").run()
    assert set(at.dataframe[0].value["family"]) == {"vit"}
    assert list(at.dataframe[0].value["rank"]) == list(table.set_index("model").loc[at.dataframe[0].value["model"],
                                                                                   "rank"])  # never re-ranked
    assert any("shown after the filters" in c.value for c in at.caption)  # and the page says so
    shared = _app(store_dir)  # a shared URL restores the view
    shared.query_params["family"] = "vit"
    shared.query_params["suite"] = "imagenet-star"
    shared.run()
    assert set(shared.dataframe[0].value["family"]) == {"vit"}
    at.multiselect(key="family").unselect("vit").run()
    at.checkbox(key="verified").check().run()
    assert _grid(at, "community_table") is None and _grid(at, "main_table").equals(table)
    at.checkbox(key="verified").uncheck().run()
    at.checkbox(key="construction").check().run()
    assert _grid(at, "main_table").equals(table)  # a verified construction model is still never ranked
    community = _grid(at, "community_table").set_index("model")
    assert community.loc["timm/resnet50.tv_in1k", "not_ranked_because"].startswith("construction model")
    assert community.loc["timm/resnet50.tv_in1k", "verified"]

    at.selectbox(key="model").select("timm/efficientnet_b0.ra_in1k-v3").run()
    assert not at.exception
    prov = next(d.value for d in at.dataframe if "field" in d.value.columns)
    prov = dict(zip(prov["field"], prov["value"]))
    assert prov["config hash"] and prov["manifest sha256"] == json.loads(
        next(store_dir.glob("imagenet-star/*efficientnet_b0*/result.json")).read_text())["suite"]["manifest_sha256"]
    assert any(s.value.startswith("Verified") for s in at.success)
    assert any("20 images re-run" in t.value for t in at.text)  # stamp fields: plain text only
    worst = next(d.value for d in at.dataframe if "class" in d.value.columns)
    assert list(worst["acc1"]) == sorted(worst["acc1"])


def test_app_shows_rejected_entries_and_keeps_user_text_inert(store_dir):
    at = _app(store_dir).run()
    rejected = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    assert any("does not verify" in r for r in rejected["reason"])
    assert any("schema_version 2" in r for r in rejected["reason"])
    at.selectbox(key="model").select(XSS).run()
    assert not at.exception
    for el in list(at.markdown) + list(at.caption) + list(at.title) + list(at.subheader):
        assert "<script>" not in el.value and "javascript:" not in el.value
    assert any("javascript:alert(1)" in t.value for t in at.text)  # the note is shown, as plain text
    # the only HTML is the app's fixed style sheet
    assert [h.proto.body for h in at.get("html")] == ["<style>[data-testid='stStatusWidget'] button {display: none}</style>"]
    heat = next(el for el in at.get("plotly_chart") if el.proto.id.endswith("heatmap"))
    assert "<script>" not in heat.proto.spec


def test_app_empty_store_and_missing_store(tmp_path):
    (tmp_path / "empty").mkdir()
    at = _app(tmp_path / "empty").run()
    assert not at.exception and at.info and "No results yet" in at.info[0].value
    at = _app(tmp_path / "nope").run()
    assert not at.exception and at.error and "Could not open the results store" in at.error[0].value


def test_cli_bad_store_and_port_in_use(tmp_path, capsys):
    import socket

    from genshift.cli import main
    assert main(["leaderboard", "--results", str(tmp_path / "nope")]) != 0
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "s").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["leaderboard", "--results", str(tmp_path / "s"), "--port", str(port)]) != 0
        assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def _chrome():
    return shutil.which("chromium") and shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(not _chrome(), reason="Debian chromium + chromium-driver are not installed")
def test_real_browser_renders_the_leaderboard(store_dir, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import chromium, open_when_serving, until_checked

    from tests.hubtools import free_port
    port = free_port()
    env = {**os.environ, "GENSHIFT_RESULTS": str(store_dir)}
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true",
                               "--browser.gatherUsageStats", "false"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    driver = chromium(tmp_path / "chrome")
    try:
        open_when_serving(driver, f"http://127.0.0.1:{port}/?suite=imagenet-star")
        WebDriverWait(driver, 90).until(lambda d: "ranked by" in d.find_element(By.TAG_NAME, "body").text)
        WebDriverWait(driver, 30).until(lambda d: "Top 10 as text" in d.find_element(By.TAG_NAME, "body").text)
        # the background check has finished (no progress bar): the table is complete
        until_checked(driver, timeout=90)
        time.sleep(1)
        driver.find_element(By.XPATH, "//*[contains(text(), 'Top 10 as text')]").click()
        WebDriverWait(driver, 30).until(lambda d: "timm/convnext" in d.find_element(By.TAG_NAME, "body").text
                                        or "timm/vit" in d.find_element(By.TAG_NAME, "body").text)
        body = driver.find_element(By.TAG_NAME, "body").text
        shot = tmp_path / "leaderboard.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        top = [line.split()[1] for line in body.splitlines() if line.strip()[:1].isdigit() and "timm/" in line]
        store = load_store(str(store_dir), trusted_keys=os.environ["GENSHIFT_TRUSTED_KEYS"])
        df = aggregate.model_table([e for e in store.for_suite("imagenet-star")
                                    if not e.result["flags"]["construction_model"]])
        expected = list(df[df["ranked"]].sort_values("mean_shift_acc1", ascending=False)["model"])
        assert top[:3] == [m for m in expected if m.startswith("timm/")][:3]
        assert "timm/community.model" not in top  # the best numbers, unverified: listed, never ranked
        assert "Community entries (not verified, not ranked)" in body and "timm/community.model" not in expected
        # the model named <script>alert(1)</script> stayed text: no such script element, no alert open
        assert not driver.execute_script(
            "return Array.from(document.scripts).some(s => (s.text || '').includes('alert(1)'))")
        from selenium.common.exceptions import NoAlertPresentException
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=10)


def test_submit_opens_one_pull_request_and_refuses_bad_results(tmp_path, toy_suite, tiny_checkpoint, tiny_id, tiny_folder,
                                                              capsys):
    from huggingface_hub import HfApi

    from genshift.cli import main
    from genshift import evaluate
    from genshift.leaderboard.submit import submit
    from tests.fakehub import FakeHub

    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("org/results", repo_type="dataset")
        url = submit(rpath.parent, "org/results", endpoint=fh.endpoint, token="t")
        assert url.endswith("/discussions/1")
        files = set(api.list_repo_files("org/results", repo_type="dataset", revision="refs/pr/1"))
        assert {f"toy/{tiny_folder}/result.json", f"toy/{tiny_folder}/predictions/base.parquet",
                f"toy/{tiny_folder}/predictions/shifted.parquet"} <= files
        assert f"toy/{tiny_folder}/result.json" not in set(api.list_repo_files("org/results", repo_type="dataset"))
        # the PR's content is a valid store: a maintainer can load it as is
        from huggingface_hub import snapshot_download
        snap = snapshot_download("org/results", repo_type="dataset", revision="refs/pr/1", endpoint=fh.endpoint,
                                 cache_dir=str(tmp_path / "c"))
        assert [e.model_id for e in load_store(snap).entries] == [tiny_id]
        result = json.loads(rpath.read_text())
        result["metrics"]["configs"]["base"]["acc1"]["value"] = 0.99
        rpath.write_text(json.dumps(result))
        from genshift.errors import BenchError
        with pytest.raises(BenchError, match="does not verify .*metrics.configs.base.acc1"):
            submit(rpath.parent, "org/results", endpoint=fh.endpoint, token="t")
        assert fh.repos[("dataset", "org/results")].prs == 1  # the refused submission opened nothing


def test_verify_stamp_marks_an_entry_verified(tmp_path, toy_suite, tiny_checkpoint, capsys):
    from genshift.cli import main
    from genshift import evaluate

    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    store = tmp_path / "runs"
    key = tmp_path / "maintainer.key"
    assert main(["keygen", str(key)]) == 0
    assert not load_store(str(store), trusted_keys=f"{key}.pub").entries[0].verified
    with pytest.raises(SystemExit):  # an unsigned stamp is never written (--stamp is gone)
        main(["verify", str(rpath), "--stamp"])
    assert "unrecognized arguments: --stamp" in capsys.readouterr().err
    assert main(["verify", str(rpath), "--recheck", "5", "--checkpoint", str(tiny_checkpoint), "--sign", str(key),
                 "--suite", str(toy_suite)]) == 0
    assert load_store(str(store), trusted_keys=f"{key}.pub").entries[0].verified


def test_csv_download_defuses_spreadsheet_formulas():
    from genshift.leaderboard.export import to_csv_bytes
    view = pd.DataFrame({"model": ["=HYPERLINK(\"http://x\")", "@SUM(A1)", "resnet50.a1_in1k", "-2+3", "-"],
                         "acc1/base": [0.5, -0.25, 0.75, float("nan"), 0.1], "verified": [True, False, True, True, True]})
    back = pd.read_csv(io.BytesIO(to_csv_bytes(view)), keep_default_na=False, na_values=[""])
    assert back["model"].tolist() == ["'=HYPERLINK(\"http://x\")", "'@SUM(A1)", "resnet50.a1_in1k", "'-2+3", "-"]
    # numbers stay numbers, in the unit the header names (the page's percent)
    assert back["acc@1/base (%)"].tolist()[:3] == [50.0, -25.0, 75.0]
    assert back["verified"].tolist() == [True, False, True, True, True]


class _Entry:
    """Just what the ranking reads of a store entry: per-config true-class ranks and pair ids."""

    def __init__(self, model_id, ranks: dict, pairs: dict | None = None):
        self.model_id, self._r, self._p = model_id, ranks, pairs or {}
        self.result = {"predictions": [{"config": c} for c in ranks]}

    def true_ranks(self, config):
        return "same-images", np.asarray(self._r[config], dtype=np.uint8)

    def pair_ids(self, config):
        return self._p[config]


def test_ranks_follow_each_familys_headline_metric():
    # LANCE: 3 source images, 5 counterfactuals; rank by Δacc@1 (higher = more robust), not by accuracy
    pairs = {"original": ["a", "b", "c"], "counterfactual": ["a", "a", "b", "c", "c"]}
    models = {  # true-class rank per row: 0 = top-1 hit
        "robust-but-weak": {"original": [0, 9, 9], "counterfactual": [0, 0, 9, 9, 9]},    # Δ = 2/5 - 1/3
        "accurate-but-brittle": {"original": [0, 0, 0], "counterfactual": [0, 9, 0, 9, 9]},  # Δ = 2/5 - 1
        "middle": {"original": [0, 0, 9], "counterfactual": [0, 0, 9, 9, 9]},               # Δ = 2/5 - 2/3
    }
    entries = [_Entry(m, r, pairs) for m, r in models.items()]
    point, reps, higher = aggregate.headline_replicates(entries, family="lance", configs=[], n_boot=200)
    assert higher and point == pytest.approx([2 / 5 - 1 / 3, 2 / 5 - 1, 2 / 5 - 2 / 3]) and reps.shape == (200, 3)
    ranks = aggregate.compute_rank_intervals(entries, family="lance", configs=[], n_boot=200)
    assert [ranks[m].rank for m in models] == [1, 3, 2]
    # the same Δ (and replicates) as the result's own metric for one model (genshift.eval.scoring)
    from genshift.eval.scoring import ScoringOptions, delta_acc_replicates, lance_pair_weights
    w = lance_pair_weights(3, ScoringOptions(n_boot=200, seed=0))
    one = delta_acc_replicates(np.array([[1], [0], [0]]), np.array([[1], [1], [0], [0], [0]]),
                               np.array([0, 0, 1, 2, 2]), np.ones(3, bool), w)
    assert one.delta[0] == pytest.approx(point[0]) and np.allclose(one.delta_reps[:, 0], reps[:, 0])

    # IN-G: rank by the top-3 failure rate, lower is better (top-1 accuracy would order them differently)
    ing = {"top1-strong": {"failures": [0, 0, 5, 5]},   # top-1 acc 1/2, top-3 failure 1/2
           "top3-strong": {"failures": [1, 2, 1, 9]}}   # top-1 acc 0,   top-3 failure 1/4
    ranks = aggregate.compute_rank_intervals([_Entry(m, r) for m, r in ing.items()], family="in_g",
                                             configs=["failures"], n_boot=200)
    assert ranks["top3-strong"].rank == 1 and ranks["top1-strong"].rank == 2


def test_tied_models_share_a_rank_and_their_interval_spans_the_tie():
    same = {"failures": [0, 5, 1, 9] * 10}  # failure rate 1/2
    entries = [_Entry(m, same) for m in ("a", "b")] + [_Entry("worse", {"failures": [5, 5, 5, 9] * 10})]  # 1
    ranks = aggregate.compute_rank_intervals(entries, family="in_g", configs=["failures"], n_boot=100)
    assert (ranks["a"].rank, ranks["a"].lo, ranks["a"].hi) == (1, 1, 2) == (ranks["b"].rank, ranks["b"].lo,
                                                                            ranks["b"].hi)
    assert (ranks["worse"].rank, ranks["worse"].lo, ranks["worse"].hi) == (3, 3, 3)


def test_superseding_is_decided_by_the_maintainers_signature_never_by_result_fields(tmp_path, monkeypatch):
    """Copies of one model on one board: an unsigned or foreign-signed copy claiming year 9999 loses to the
    verified entry; of two verified entries the later signed stamp wins although its result is older; of
    two unverified ones the first path wins, whatever their finished_at.

    A store's folder belongs to one (suite, model) (``store.misfiled``), so such copies cannot sit side by
    side in a store today; the rule is checked on its own here, with the folder rule switched off, as the
    defence behind it."""
    from genshift.eval import stamps
    from genshift.leaderboard import store as store_mod

    monkeypatch.setattr(store_mod, "misfiled", lambda path, result: "")

    root = tmp_path / "store"
    difficulty = {c: np.random.default_rng(1).normal(0, 1.2, 30) for c in ["base", "shift_01"]}
    key, foreign = tmp_path / "maintainer.key", tmp_path / "forger.key"
    stamps.generate_key(foreign)

    def entry(folder, model_id, finished_at, signer=None, verified_at=None):
        p = write_model(tmp_path / "tmp", suite_id="imagenet-star", configs=list(difficulty), difficulty=difficulty,
                        rng=np.random.default_rng(len(folder)), model_id=model_id, architecture="resnet50",
                        tag="a1_in1k", num_params=25e6, skill=1.0, finished_at=finished_at)
        dst = root / "imagenet-star" / folder
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p.parent), str(dst))
        if signer:
            _sign_stamp(dst / "result.json", signer)
            if verified_at:  # the maintainer re-signs with this time (covered by the signature)
                s = json.loads((dst / "verification.json").read_text())
                s["verified_at"] = verified_at
                (dst / "verification.json").write_bytes(
                    canonical_json(stamps.sign(s, stamps.load_private_key(signer))))

    from genshift.fsutil import canonical_json
    entry("m-genuine", "timm/m", "2026-01-01T00:00:00+00:00", key, "2026-02-01T00:00:00+00:00")
    entry("m-resigned", "timm/m", "2025-01-01T00:00:00+00:00", key, "2026-03-01T00:00:00+00:00")
    entry("a-m-9999", "timm/m", "9999-12-31T23:59:59+00:00")                   # unsigned, sorts first
    entry("a-m-forged", "timm/m", "9999-12-31T23:59:59+00:00", foreign)       # signed by an untrusted key
    entry("u-b", "timm/u", "9999-01-01T00:00:00+00:00")
    entry("u-a", "timm/u", "2020-01-01T00:00:00+00:00")
    store = load_store(str(root), trusted_keys=f"{key}.pub")
    shown = {e.model_id: e.path.parent.name for e in store.entries}
    assert shown == {"timm/m": "m-resigned", "timm/u": "u-a"}
    reasons = {e.path.parent.name: e.reason for e in store.superseded}
    assert set(reasons) == {"m-genuine", "a-m-9999", "a-m-forged", "u-b"}
    assert "stamp signed later" in reasons["m-genuine"] and "first path" in reasons["u-b"]
    # the same order whatever order the entries were checked in (the index and the cold board reassemble them)
    from genshift.leaderboard.store import Store, assemble
    every = store.entries + store.superseded
    again = assemble(Store(source="x", root=root, revision=None), list(reversed(every)))
    assert {e.model_id: e.path.parent.name for e in again.entries} == shown
