"""The board's own pieces: uncertainty, ranks once per board, URL views, escaping, the index, the Space,
ImageNet-val accuracy, failure-direction pictures."""

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from genshift.leaderboard import aggregate
from genshift.leaderboard.synthetic import ARCHS, make_store, write_model
from tests.test_leaderboard import _app, _grid, _sign_stamp, clear_streamlit_caches  # noqa: F401  (autouse fixture)

CONFIGS = ["base", "shift_01", "shift_02"]
LINK = "[m](https://evil.example) ![i](https://evil.example/a.png)"
CFG_LINK = "[c](javascript:alert(1))"


def sign_all(root, key):
    """A maintainer's signed stamp on every entry under ``root``; the board trusts ``key`` from now on."""
    for p in sorted(root.glob("*/*/result.json")):
        _sign_stamp(p, key)
    os.environ["GENSHIFT_TRUSTED_KEYS"] = f"{key}.pub"


def _board(root, *, models=8, extra=(), signed=True):
    """A board of ``models`` models, two of them tied exactly, plus ``extra`` (model_id, kw) entries; every
    entry verified (signed with ``<root>.key``, trusted through ``GENSHIFT_TRUSTED_KEYS``) unless not ``signed``."""
    make_store(root, models=models, configs=len(CONFIGS), rows=60, seed=3)
    first = json.loads(next(root.glob("*/*/result.json")).read_text())
    difficulty = {c: np.random.default_rng(3).normal(0, 1.2, 60) for c in CONFIGS}
    common = dict(suite_id="imagenet-star", configs=CONFIGS, difficulty=difficulty,
                  manifest=first["suite"]["manifest_sha256"])
    for mid in ("timm/tie_a.in1k", "timm/tie_b.in1k"):  # same rng, same skill: identical predictions
        write_model(root, model_id=mid, architecture="resnet18", tag="in1k", num_params=11e6, skill=1.0,
                    rng=np.random.default_rng(42), **common)
    for mid, kw in extra:
        write_model(root, model_id=mid, rng=np.random.default_rng(7), **{**common, **kw})
    if signed:
        sign_all(root, root.parent / f"{root.name}.key")
    return root


def _array(v):
    """A plotly spec array: a list, or numpy's bytes in base64 (``{"bdata", "dtype"}``)."""
    import base64
    return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist() if isinstance(v, dict) else v


def test_fit_band_matches_a_hand_computed_case():
    # x = .1 .2 .3, y = .1 .3 .2: slope .5, intercept .1, residuals -.05 .1 -.05, SSres .015, s² = .015 (n-2 = 1),
    # Sxx = .02; at x0 = .2: se = sqrt(.015/3) = .0707107, t(.975, 1) = 12.7062 -> half-width .898464;
    # at x0 = .3: se = sqrt(.015 (1/3 + .01/.02)) = .1118034 -> half-width 1.420598
    lo, hi = aggregate.fit_band([0.1, 0.2, 0.3], [0.1, 0.3, 0.2], [0.2, 0.3])
    assert lo == pytest.approx([0.2 - 0.898464, 0.25 - 1.420598], abs=1e-5)
    assert hi == pytest.approx([0.2 + 0.898464, 0.25 + 1.420598], abs=1e-5)
    assert np.isnan(aggregate.fit_band([0.1, 0.2], [0.1, 0.3], [0.2])[0]).all()  # 2 points: no band


def test_point_ranks_share_float_ties():
    assert aggregate.point_ranks([0.3, 0.1 + 0.2, 0.5, np.nan], higher=True)[:3].tolist() == [2, 2, 1]
    assert aggregate.point_ranks([0.3, 0.1 + 0.2, 0.5], higher=False).tolist() == [1, 1, 3]


def test_ranks_once_per_board_ties_order_intervals_and_units(tmp_path):
    root = _board(tmp_path / "s")
    at = _app(root).run()
    assert not at.exception
    t = at.dataframe[0].value
    assert list(t["rank"]) == sorted(t["rank"])  # 0 inversions: row order follows rank
    ties = t.set_index("model").loc[["timm/tie_a.in1k", "timm/tie_b.in1k"]]
    assert ties["rank"].nunique() == 1  # exact ties share a rank
    assert ((t["mean_shift_acc1_lo"] <= t["mean_shift_acc1"]) & (t["mean_shift_acc1"] <= t["mean_shift_acc1_hi"])).all()
    assert (t["mean_shift_acc1_hi"] > t["mean_shift_acc1_lo"]).all()
    cols = json.loads(at.dataframe[0].proto.columns)
    assert cols["model_mean_impact"]["type_config"]["format"] == "%.2f pp"  # a difference: percentage points
    assert cols["mean_shift_acc1"]["type_config"]["format"] == "percent"
    assert cols["construction_model"]["label"] == "construction model"
    text = next(x.value for x in at.text if x.value.lstrip().startswith(str(int(t["rank"].iloc[0]))))
    lines = text.splitlines()
    assert [int(line.split()[0]) for line in lines] == [int(r) for r in t["rank"].head(10)]  # numbered by rank
    all_ranks = dict(zip(t["model"], t["rank"]))
    at.multiselect(key="family").select("resnet").run()
    f = at.dataframe[0].value
    assert set(f["family"]) == {"resnet"} and all(all_ranks[m] == r for m, r in zip(f["model"], f["rank"]))
    heat = next(el for el in at.get("plotly_chart") if el.proto.id.endswith("heatmap"))
    spec = json.loads(heat.proto.spec)["data"][0]
    assert spec["zmin"] == 0 and spec["zmax"] == 100 and len(spec["y"]) == len(f)  # anchored, every row
    # rows are labelled by the official rank, not by position: the two tied models both read "#r"
    assert list(spec["y"]) == [f"#{int(r)} {m}" for r, m in zip(f["rank"], f["model"])]
    tie = {y.split()[1]: y.split()[0] for y in spec["y"]}
    assert tie["timm/tie_a.in1k"] == tie["timm/tie_b.in1k"]  # a position would differ
    # the About tab: what is ranked, how entries are verified, every metric with its paper, how to submit
    about = " ".join(m.value for m in at.markdown)
    for needle in ("What is ranked", "How entries are verified", "How to submit", "Vendrow et al., 2023",
                   "Prabhu et al., 2023", "Wiles et al., 2022", "Taori et al., 2020", "Jain et al., ICLR 2023",
                   "verified* and *complete*", "bench submit"):
        assert needle in about, needle


def test_deep_links_restore_every_view(tmp_path):
    root = _board(tmp_path / "s")
    at = _app(root)
    for k, v in {"suite": "imagenet-star", "family": ["resnet", "vit"], "params": ["10.0", "80.0"], "tab": "ID/OOD",
                 "model": "timm/tie_b.in1k", "shift": "shift_02", "drill_config": "shift_01",
                 "verified": "false"}.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception
    assert at.multiselect(key="family").value == ["resnet", "vit"]
    assert at.slider(key="params").value == (10.0, 80.0)
    assert at.selectbox(key="model").value == "timm/tie_b.in1k"
    assert at.selectbox(key="shift").value == "shift_02"
    assert at.selectbox(key="drill_config").value == "shift_01"
    assert at.session_state["tab"] == "ID/OOD"
    assert set(at.dataframe[0].value["family"]) <= {"resnet", "vit"}


def test_data_text_is_never_markdown_and_grids_are_formula_safe(tmp_path):
    root = _board(tmp_path / "s", models=4, extra=[
        (LINK, dict(architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=2.0, notes=LINK)),
        ("=HYPERLINK(\"https://evil.example\")", dict(architecture="resnet50", tag="a1_in1k", num_params=25e6,
                                                      skill=0.0))])
    at = _app(root)
    at.query_params["model"] = LINK
    at.run()
    assert not at.exception and at.selectbox(key="model").value == LINK
    md = [el.value for kind in ("markdown", "caption", "title", "subheader", "success", "warning", "info", "error")
          for el in at.get(kind)]
    assert md and not any("evil.example" in v or "javascript:" in v for v in md)
    assert any(LINK in t.value for t in at.text)  # shown, literally
    grid = at.dataframe[0].value
    # the page shows text as it is; only the CSV download defuses formula-like cells, and "-" is not one
    assert LINK in set(grid["model"]) and "=HYPERLINK(\"https://evil.example\")" in set(grid["model"])
    from tests.test_leaderboard import _download
    csv = _download(at, "download_csv").decode()
    assert "'=HYPERLINK(" in csv and "\n=HYPERLINK" not in csv and ",=HYPERLINK" not in csv
    prov = next(d.value for d in at.dataframe if "field" in d.value.columns)
    assert dict(zip(prov["field"], prov["value"]))["code version"] == "-"  # the placeholder, plainly
    assert all(h.proto.body == "<style>[data-testid='stStatusWidget'] button {display: none}</style>"
               for h in at.get("html"))


def test_data_text_is_escaped_in_plots(tmp_path):
    # config names are held to one strict pattern by the result schema; model ids are free text
    root = tmp_path / "s"
    difficulty = {c: np.random.default_rng(1).normal(0, 1, 30) for c in ["base", "shift_01"]}
    for i in range(3):
        write_model(root, suite_id="imagenet-star", configs=list(difficulty), model_id=f"<i>m{i}" + CFG_LINK,
                    architecture="resnet50", tag="in1k", num_params=25e6, skill=i, difficulty=difficulty,
                    rng=np.random.default_rng(i))
    at = _app(root, trusted_keys=None).run()
    assert not at.exception
    for el in at.get("plotly_chart"):
        spec = json.dumps(json.loads(el.proto.spec), ensure_ascii=False)
        assert "<i>" not in spec
        assert "‹i›m" in spec or el.proto.id.endswith("drill_bars")  # the bars name configs, not models
    assert any("few" in w.value.lower() or "Only 3 models" in w.value for w in at.warning)  # under the minimum


def test_id_accuracy_csv_joins_and_refuses_bad_files(tmp_path, capsys):
    root = _board(tmp_path / "s")
    csv = tmp_path / "results-imagenet.csv"
    csv.write_text("\ufeffmodel,img_size,top1,top1_err,top5\nresnet50.a1_in1k-v0,224,80.1,19.9,95\n"
                   "vit_base_patch16_224.augreg_in21k_ft_in1k-v1,224,81.2,18.8,96\ntie_a.in1k,224,70.0,30,90\n"
                   "tie_b.in1k,224,70.0,30,90\nconvnext_tiny.fb_in1k-v2,224,82.0,18,96\n")
    table = aggregate.read_id_accuracy(csv)
    assert table["tie_a.in1k"] == pytest.approx(0.70)
    matched, unmatched = aggregate.join_id_accuracy(["timm/tie_a.in1k", "hf-hub:timm/tie_b.in1k", "x/y"], table)
    assert set(matched) == {"timm/tie_a.in1k", "hf-hub:timm/tie_b.in1k"} and unmatched == ["x/y"]
    at = _app(root, id_accuracy=csv)
    at.query_params["x"] = "ImageNet-val top-1 (--id-accuracy)"
    at.run()
    assert not at.exception
    assert any("5 of 10 models matched, 5 unmatched" in t.value for t in at.text)
    chart = next(el for el in at.get("plotly_chart") if el.proto.id.endswith("id_ood"))
    assert sorted(_array(json.loads(chart.proto.spec)["data"][0]["x"])) == pytest.approx([70, 70, 80.1, 81.2, 82])
    er = next(d.value for d in at.dataframe if "effective_robustness_linear" in d.value.columns)
    assert list(er["effective_robustness_linear"]) == sorted(er["effective_robustness_linear"], reverse=True)
    # the paper's shift impact: a shift's drop averaged over the fitted models, from their own impacts
    imp = next(d.value for d in at.dataframe if "shift_impact" in d.value.columns).set_index("shift")
    results = [json.loads(p.read_text()) for p in root.glob("*/*/result.json")]
    fitted = [r for r in results if r["model"]["id"].split(":")[-1].split("/")[-1] in table]
    for sh in ("shift_01", "shift_02"):
        drops = [r["metrics"]["imagenet_star"]["absolute_impact"][sh]["value"] for r in fitted]
        assert imp.loc[sh, "shift_impact"] == pytest.approx(100 * np.mean(drops))
        assert imp.loc[sh, "models"] == len(drops) == 5

    from genshift.cli import main
    bad = tmp_path / "bad.csv"
    bad.write_text("model,top1\nresnet50,eighty\n")
    assert main(["leaderboard", "--results", str(root), "--id-accuracy", str(bad)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "bad.csv:2" in err and len(err.strip().splitlines()) == 1
    bad.write_text("name,acc\nresnet50,80\n")
    with pytest.raises(Exception, match="needs columns 'model' and 'top1'"):
        aggregate.read_id_accuracy(bad)


def _index_parts(path):
    """The index file's three lines: MAC, head, body (genshift.leaderboard.index)."""
    mac, head, body = path.read_bytes().split(b"\n", 2)
    return mac, json.loads(head), json.loads(body)


class _Reads:
    """Every file opened or hashed under ``root`` (Python's open, pathlib, the hashing helpers)."""

    def __init__(self, monkeypatch, root):
        import builtins
        import io

        from genshift import fsutil
        from genshift.leaderboard import store as store_mod

        self.paths, root = [], str(Path(root).resolve()) + os.sep
        real_open, real_sha = io.open, fsutil.sha256_file

        def opening(file, *a, **k):
            if isinstance(file, (str, os.PathLike)) and str(Path(file).resolve()).startswith(root):
                self.paths.append(Path(file).name)
            return real_open(file, *a, **k)
        monkeypatch.setattr(builtins, "open", opening)
        monkeypatch.setattr(io, "open", opening)
        monkeypatch.setattr(store_mod, "sha256_file", lambda p: self.paths.append(Path(p).name) or real_sha(p))


@pytest.mark.parametrize("relative", [True, False], ids=["relative-results", "absolute-results"])
def test_index_paints_a_restarted_board_and_skips_changed_entries(tmp_path, monkeypatch, relative):
    """A restarted board paints its first view from the index's head without opening or hashing any file
    of the store (stat keys only), the same table the full store gives; the body follows and is the whole
    board, still without hashing; a changed entry makes the head unusable and is dropped from the body."""
    from genshift.leaderboard.index import Loader, index_path, read_head, read_index, view_frame
    from genshift.leaderboard.store import load_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = Path("s") if relative else tmp_path / "s"  # `bench leaderboard --results s` passes the folder as given
    _board(root, models=10)
    keys = os.environ["GENSHIFT_TRUSTED_KEYS"]
    calls = []
    full = load_store(str(root), trusted_keys=keys, progress=lambda i, n, e: calls.append((i, n, e.status)))
    assert [c[:2] for c in calls] == [(i, 12) for i in range(1, 13)]
    first = Loader(str(root), trusted_keys_file=keys)
    assert first.wait(60) and first.kind == "full" and index_path(root).is_file()
    _, head, body = _index_parts(index_path(root))
    assert sorted(r["path"] for r in body["entries"]) == sorted(p.relative_to(root).as_posix()
                                                                for p in root.glob("*/*/result.json"))
    monkeypatch.setattr(Loader, "HEAD_GRACE_S", 30.0)  # the body waits: the first view alone is painted
    reads = _Reads(monkeypatch, root)
    second = Loader(str(root), trusted_keys_file=keys)  # a restarted server
    store, state = second.snapshot()
    view = second.first_view()
    assert state["kind"] == "head" and store is None and view is not None and reads.paths == []
    expected, meta = aggregate.board_table(full.for_suite(full.suites()[0]), intervals=True)
    painted = view_frame(view)
    assert view["counts"] == {"results": 12, "verified": 12, "rejected": 0, "superseded": 0}
    assert view["meta"] == json.loads(json.dumps(meta)) and painted["ranked"].sum() == 12
    assert painted["rank_lo"].notna().all()  # rank intervals, not point ranks
    import pandas as pd
    pd.testing.assert_frame_equal(painted, expected)
    second.want_store(wait=30)  # a view that needs more: the body is read, nothing hashed
    store, state = second.snapshot()
    assert state["kind"] == "index" and len(store.entries) == 12 and reads.paths == []
    assert second.wait(60) and second.snapshot()[1]["kind"] == "full"
    monkeypatch.undo()  # reads are no longer counted
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    r = next(root.glob("*/*/result.json"))
    data = json.loads(r.read_text())
    data["notes"] = "changed"
    r.write_text(json.dumps(data))
    digest = Loader(str(root), trusted_keys_file=keys).keys_digest
    assert read_head(root, None, keys_digest=digest) is None  # the head is only for an unchanged store
    store, dropped = read_index(str(root), root, None, keys_digest=digest)
    assert dropped == 1 and len(store.entries) == 11  # the changed entry waits for its check


def test_index_is_used_only_as_written_under_the_same_keys_and_files(tmp_path, monkeypatch):
    """The index makes nothing verified that the full check would not: an edited index (an unsigned entry's
    status flipped to verified), one written under other trusted keys, one signed by another board's
    secret, and one whose files were touched (same bytes, new mtime) or rewritten in place with size and
    mtime put back (only ctime moves) are not used."""
    from genshift.leaderboard import index

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = _board(tmp_path / "s", models=4)
    victim = next(root.glob("*/*/verification.json"))
    victim.unlink()  # one entry unsigned: accepted, not verified, not ranked
    keys = os.environ["GENSHIFT_TRUSTED_KEYS"]
    loader = index.Loader(str(root), trusted_keys_file=keys)
    assert loader.wait(60)
    path, digest = index.index_path(root), loader.keys_digest
    assert index.read_head(root, None, keys_digest=digest) is not None
    good = path.read_bytes()
    mac, head, body = _index_parts(path)
    rel = victim.parent.relative_to(root).as_posix()
    rec = next(r for r in body["entries"] if r["path"].startswith(rel + "/"))
    assert rec["status"] == "accepted"
    rec["status"], rec["stamp"] = "verified", {"verified_at": "2026-11-01T00:00:00+00:00"}
    row = head["view"]["columns"].index("verified")
    for r in head["view"]["rows"]:
        r[row] = True
    forged_body = json.dumps(body).encode()
    head["body_sha256"] = index.sha256_bytes(forged_body)
    path.write_bytes(mac + b"\n" + json.dumps(head).encode() + b"\n" + forged_body)
    assert index.read_head(root, None, keys_digest=digest) is None
    assert index.read_index(str(root), root, None, keys_digest=digest) is None
    forged = index.Loader(str(root), trusted_keys_file=keys)
    assert forged.kind == "none" and forged.first_view() is None  # checked from scratch, not painted from it
    assert forged.wait(60)
    store = forged.snapshot()[0]
    assert not next(e for e in store.entries if e.run_dir == victim.parent).verified

    path.write_bytes(good)  # the body alone edited (its sha256 is in the signed head): not used either
    mac, head, body = _index_parts(path)
    path.write_bytes(good.rsplit(b"\n", 1)[0] + b"\n" + json.dumps(body).replace('"accepted"', '"verified"').encode())
    assert index.read_index(str(root), root, None, keys_digest=digest) is None

    path.write_bytes(good)
    other_keys = tmp_path / "other.pub"
    other_keys.write_text("")
    assert index.read_head(root, None, keys_digest=index._keys_digest(str(other_keys))) is None
    assert index.read_index(str(root), root, None, keys_digest=index._keys_digest(str(other_keys))) is None
    (path.parent / "leaderboard-index.key").unlink()  # another board's secret (or a copied index)
    assert index.read_head(root, None, keys_digest=digest) is None

    index.write_index(forged.snapshot()[0], keys_digest=digest)  # written anew by this board: used again
    assert index.read_head(root, None, keys_digest=digest) is not None
    f = next(root.glob("*/*/predictions/shift_01.parquet"))
    st_ = f.stat()
    os.utime(f, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1))  # touched, same bytes
    assert index.read_head(root, None, keys_digest=digest) is None
    index.write_index(forged.snapshot()[0], keys_digest=digest)
    _, head, _ = _index_parts(path)
    head["files"][f.parent.parent.relative_to(root).as_posix()]["predictions/shift_01.parquet"] = [
        f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ctime_ns, f.stat().st_ino]
    st_ = f.stat()
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st_.st_atime_ns, st_.st_mtime_ns))  # size and mtime as before: only ctime moved
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st_.st_size, st_.st_mtime_ns)
    assert index.read_head(root, None, keys_digest=digest) is None
    store, dropped = index.read_index(str(root), root, None, keys_digest=digest)
    assert dropped == 1 and f.parent.parent not in {e.run_dir for e in store.entries}


def test_store_checked_by_a_pool_of_processes_as_by_one(tmp_path, monkeypatch):
    """load_store with worker processes: the workers checked the entries after the first chunk, and every
    entry's status, reason and note, the verification cache and the progress calls are the serial check's;
    a tampered entry is rejected by a worker as it is serially."""
    import multiprocessing

    from genshift.leaderboard.store import _cache_path, load_store

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = _board(tmp_path / "s", models=6)
    f = next(root.glob("*/*/predictions/shift_02.parquet"))
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    next(root.glob("*/*-v3/verification.json")).unlink()  # one unsigned: accepted, not verified
    keys = os.environ["GENSHIFT_TRUSTED_KEYS"]
    seen = {}
    for workers in (2, 1):
        _cache_path(root, None).unlink(missing_ok=True)
        calls = []
        store = load_store(str(root), trusted_keys=keys, workers=workers,
                           progress=lambda i, n, e: calls.append((i, n)))
        state = {e.path: (e.status, e.reason, e.note) for e in store.entries + store.rejected + store.superseded}
        seen[workers] = (state, json.loads(_cache_path(root, None).read_text()), calls, store.checked_by)
    (pool, pool_cache, pool_calls, by_pid), (serial, serial_cache, serial_calls, _) = seen[2], seen[1]
    assert pool == serial and pool_cache == serial_cache and pool_calls == serial_calls == [(i, 8) for i in range(1, 9)]
    # the first chunk (4) checked here while the workers start, the rest in worker processes (which of the
    # two takes which chunk is the scheduler's affair)
    workers = {pid: n for pid, n in by_pid.items() if pid != os.getpid()}
    assert by_pid[os.getpid()] == 4 and 1 <= len(workers) <= 2 and sum(workers.values()) == 4, by_pid
    assert not multiprocessing.active_children()
    statuses = sorted(s for s, _, _ in pool.values())
    assert statuses == ["accepted"] + ["rejected"] + ["verified"] * 6
    assert any("sha256" in r for s, r, _ in pool.values() if s == "rejected")


def test_the_check_leaves_each_entrys_ranks_so_ranking_reads_no_predictions_file(tmp_path, monkeypatch):
    """A cold check (in worker processes and serially) writes the true-class ranks of every entry it verified,
    from the tables it hashed and read; ranking the board with rank intervals then reads no predictions file,
    and gets the ranks a fresh read gives. A file changed after the check is still refused."""
    from genshift.errors import IntegrityError
    from genshift.eval import predictions
    from genshift.leaderboard.store import _cache_path, load_store

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = _board(tmp_path / "s", models=6)
    keys = os.environ["GENSHIFT_TRUSTED_KEYS"]
    for workers in (2, 1):
        cache = _cache_path(root, None)
        cache.unlink(missing_ok=True)
        shutil.rmtree(cache.parent / (cache.stem + "-hits"), ignore_errors=True)
        store = load_store(str(root), trusted_keys=keys, workers=workers)
        assert len(store.entries) == 8
        assert sorted(p.name for p in (cache.parent / (cache.stem + "-hits")).glob("*-ranks.npz")) == \
            sorted(f"{e.content_key[:32]}-ranks.npz" for e in store.entries)
        read = []
        real = predictions.read_predictions
        monkeypatch.setattr(predictions, "read_predictions", lambda *a, **k: read.append(a[0]) or real(*a, **k))
        df, _ = aggregate.board_table(store.entries, intervals=True)
        assert read == [] and df["rank_lo"].notna().sum() == 8
        monkeypatch.undo()
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        for e in store.entries:
            fresh = e.ranks_from_tables({p["config"]: real(e.run_dir / p["path"]) for p in e.result["predictions"]})
            for c, (ids, ranks) in fresh.items():
                assert e.true_ranks(c)[0] == ids and np.array_equal(e.true_ranks(c)[1], ranks)
    e = store.entries[0]
    f = e.run_dir / e.result["predictions"][0]["path"]
    e._ranks = None
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(IntegrityError, match="changed since the leaderboard loaded"):
        e.true_ranks(e.result["predictions"][0]["config"])


def test_app_runs_only_as_streamlits_main_not_in_a_check_worker(tmp_path):
    """A spawned worker of the store check imports the parent's ``__main__`` again as ``__mp_main__``; in
    the Streamlit server that is app.py, which must not open a store (and start a check of its own) there,
    nor import Streamlit and the page (a second of CPU per worker while a cold board paints). As
    ``__main__`` (how Streamlit runs it) it does."""
    import subprocess
    import sys

    from tests.test_leaderboard import APP

    code = ("import runpy, sys; import genshift.leaderboard.index as i; calls = []\n"
            "i.open_loader = lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(RuntimeError('stop'))\n"
            "try:\n    runpy.run_path(sys.argv[1], run_name=sys.argv[2])\nfinally:\n    print('OPENED', len(calls))\n"
            "    print('IMPORTED', sorted(m for m in ('streamlit', 'pandas', 'genshift.leaderboard.ui') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "GENSHIFT_RESULTS": str(tmp_path)}
    opened = {}
    for name in ("__mp_main__", "__main__"):
        out = subprocess.run([sys.executable, "-c", code, APP, name], env=env, capture_output=True, text=True,
                             timeout=120)
        found = re.findall(r"^OPENED (\d+)$", out.stdout, re.M)  # (bare mode: the app's st.stop() may raise)
        assert found, out.stderr[-2000:]
        opened[name] = (int(found[-1]), re.findall(r"^IMPORTED (.*)$", out.stdout, re.M)[-1])
    assert opened == {"__mp_main__": (0, "[]"), "__main__": (1, "['genshift.leaderboard.ui', 'pandas', 'streamlit']")}


def test_views_rehash_only_files_that_changed_on_disk(tmp_path, monkeypatch):
    """Entry.recheck (before every read of an entry's files for a view) hashes a file again only when its
    stat key (size, mtime_ns, inode, ctime_ns) changed; a swapped or rewritten file is still refused."""
    from genshift.errors import IntegrityError
    from genshift.leaderboard import store as store_mod

    root = tmp_path / "s"
    make_store(root, models=2, configs=3, rows=40, seed=2)
    entry = store_mod.load_store(str(root)).entries[0]
    hashed = []
    real = store_mod._file_sha256
    monkeypatch.setattr(store_mod, "_file_sha256", lambda p, limit: hashed.append(p.name) or real(p, limit))
    for _ in range(2):  # files written within RACY_NS of the check: their keys prove nothing yet, hashed each view
        entry.recheck()
    assert sorted(hashed) == sorted(2 * ["result.json", *(p.rsplit("/", 1)[1] for p in entry.predictions_sha256)])
    monkeypatch.setattr(store_mod, "RACY_NS", 0)  # as if the files were long settled
    entry = store_mod.load_store(str(root)).entries[0]
    hashed.clear()
    for _ in range(3):  # views: a stat per file, no hashing (the check hashed them after taking their stat keys)
        entry.read_predictions("base")
        entry.recheck()
    assert hashed == []
    f = entry.run_dir / "predictions" / "base.parquet"
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1))  # touched, same bytes: hashed again, accepted
    entry.recheck()
    assert hashed == ["base.parquet"]
    hashed.clear()
    st = f.stat()  # rewritten in place, same size, mtime set back: the ctime still moves
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(IntegrityError, match="changed since the leaderboard loaded them"):
        entry.recheck()
    assert hashed == ["base.parquet"]
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))  # the checked bytes back: accepted again
    entry.recheck()
    other = store_mod.load_store(str(root)).entries[1].run_dir / "predictions" / "base.parquet"
    swapped = f.with_name("swap.tmp")
    swapped.write_bytes(other.read_bytes())
    os.utime(swapped, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns))  # same mtime; a new inode (and bytes)
    swapped.replace(f)
    with pytest.raises(IntegrityError, match="changed since the leaderboard loaded them"):
        entry.read_predictions("base")


def test_cold_store_publishes_checked_rows_as_it_goes(tmp_path, monkeypatch):
    from genshift.leaderboard import index

    root = tmp_path / "s"
    make_store(root, models=20, configs=3, rows=40, seed=4)
    seen, real = [], index.load_store

    def recording(source, progress=None, **kw):  # what the app would paint after each checked entry
        loader = progress.__self__

        def p(i, n, e):
            progress(i, n, e)
            store, s = loader.snapshot()
            seen.append((s["kind"], s["done"], s["total"], len(store.entries)))
        return real(source, progress=p, **kw)
    monkeypatch.setattr(index, "load_store", recording)
    monkeypatch.setattr(index.Loader, "PUBLISH_EVERY_S", 0.0)
    loader = index.Loader(str(root))
    assert loader.wait(60)
    assert seen[:3] == [("partial", 1, 20, 1), ("partial", 2, 20, 2), ("partial", 3, 20, 2)]
    # later repaints come once the checked count doubled (each costs a whole board's render); the last entry
    # is not published as partial: the full store follows it
    assert [done for _, done, _, shown in seen if shown == done] == [1, 2, 4, 8, 16]
    assert seen[-1] == ("partial", 20, 20, 16)
    store, state = loader.snapshot()
    assert state["kind"] == "full" and state["finished"] and len(store.entries) == 20


@pytest.mark.parametrize("models,partial", [(20, True), (3, False)], ids=["large-store", "small-store"])
def test_first_paint_waits_for_rows_not_for_the_whole_wait(tmp_path, monkeypatch, models, partial):
    """A cold store's first page waits (``Loader.wait_first_paint``) until the check has published rows and,
    at its rate so far, would not finish within the wait, or until it finished: a large store is painted
    from its first checked entry (not after the whole wait), a small one complete."""
    from genshift.leaderboard import index, store as store_mod

    root = tmp_path / "s"
    make_store(root, models=models, configs=2, rows=20, seed=4)
    real = store_mod._check_entry

    def slow(*a, **kw):  # 0.1 s per entry: a 20-entry check takes 2 s, a 3-entry one 0.3 s
        time.sleep(0.1)
        return real(*a, **kw)
    monkeypatch.setattr(store_mod, "_check_entry", slow)
    loader = index.Loader(str(root))
    loader.wait_first_paint(1.5 if partial else 5.0)  # small: finishes within the wait even on a slow machine
    waited = time.monotonic() - loader.started
    store, state = loader.snapshot()
    if partial:
        assert state["kind"] == "partial" and not state["finished"] and waited < 1.0, (state, waited)
        assert 1 <= len(store.entries) < models
    else:
        assert state["finished"] and len(store.entries) == models, state
    assert loader.wait(60)


def test_the_calling_process_passes_on_each_entry_of_its_chunk_as_it_is_checked(tmp_path, monkeypatch):
    """``check_in_pool``: the entries the calling process checks itself (the first chunk, while the workers
    start) reach ``on_checked`` one by one, so a cold board's first row waits for one entry's check, not four."""
    from genshift.leaderboard import check_pool, store as store_mod

    root = tmp_path / "s"
    make_store(root, models=check_pool.CHUNK, configs=2, rows=20, seed=4)
    paths = sorted(root.glob("*/*/result.json"))
    events, real = [], store_mod._check_entry

    def recording(path, *a, **kw):
        events.append(("check", path))
        return real(path, *a, **kw)
    monkeypatch.setattr(store_mod, "_check_entry", recording)
    by_pid = check_pool.check_in_pool(paths, {}, trusted_keys={}, suites=None, strict=False, workers=2,
                                      on_checked=lambda e: events.append(("checked", e.path)))
    assert by_pid == {os.getpid(): len(paths)}  # one chunk: no worker was needed
    assert events == [(kind, p) for p in paths for kind in ("check", "checked")]


def test_the_warm_up_starts_once_the_server_listens_and_the_app_waits_for_it(monkeypatch):
    """`bench leaderboard`'s server process (``genshift.leaderboard.serve``): the warm-up (the page's imports, then the
    store's preload) waits until Streamlit's server listens, so it never takes the GIL from Streamlit's
    start-up; ``wait_warm`` (the app's first lines) returns once the imports are done, and at once where no
    warm-up runs (a plain ``streamlit run``, AppTest, a Space); ``open_loader`` waits for the preload
    announced, so the page never opens the store a second time. A page run ends the wait for the port
    (a port set in Streamlit's config files is not on the command line)."""
    import socket
    import threading

    from genshift.leaderboard import index, serve
    from tests.hubtools import free_port

    for name in ("_warming", "_page", "_imported"):
        monkeypatch.setattr(serve, name, threading.Event())
    monkeypatch.setattr(index, "_PRELOADING", {})
    monkeypatch.setattr(index, "_PRELOADED", {})
    assert serve.wait_warm() is False  # no warm-up in this process: nothing to wait for
    calls, opened = [], []

    def slow_loader(source, **kw):
        time.sleep(0.5)
        calls.append(time.monotonic())
        return f"loader of {source}"
    monkeypatch.setattr(index, "Loader", slow_loader)
    port = free_port()
    serve._warming.set()
    warm = threading.Thread(target=serve._warm, args=("127.0.0.1", port), daemon=True)
    warm.start()
    time.sleep(0.5)
    assert not calls and not serve._imported.is_set()  # no server yet: the warm-up waits
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        listening = time.monotonic()
        assert serve.wait_warm() is True and serve._imported.is_set()
        settings = (os.environ.get("GENSHIFT_RESULTS", "runs"), os.environ.get("GENSHIFT_TRUSTED_KEYS") or None,
                    os.environ.get("GENSHIFT_SUITES") or None)
        opened.append(index.open_loader(*settings))  # the preload is under way: waited for, not opened again
    warm.join(10)
    assert len(calls) == 1 and calls[0] >= listening and opened == [f"loader of {settings[0]}"]
    # no server on the port the warm-up polls, but a page run began: the warm-up goes on at once
    for name in ("_page", "_imported"):
        monkeypatch.setattr(serve, name, threading.Event())
    monkeypatch.setattr(index, "_PRELOADING", {})
    warm = threading.Thread(target=serve._warm, args=("127.0.0.1", free_port()), daemon=True)
    warm.start()
    t = time.monotonic()
    assert serve.wait_warm() is True and time.monotonic() - t < 10  # not LISTEN_WAIT_S
    warm.join(10)
    assert len(calls) == 2
    assert serve._option(["run", "app.py", "--server.port", "8123", "--server.address=::"], "--server.port", "") == "8123"
    assert serve._option(["--server.address=::"], "--server.address", "x") == "::"


def test_a_new_entry_is_checked_under_a_running_board_and_files_that_are_no_entry_start_no_check(tmp_path, monkeypatch):
    """The app's loader key (``_signature``) follows the entries ``load_store`` reads (``<suite>/<run>/``
    result and stamp): a new entry is checked and shown on the next run; a result.json inside an entry's
    folder or directly in the store changes no entry, so starts no new check."""
    from genshift.leaderboard import store as store_mod

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = _board(tmp_path / "s", models=3)
    checked, real = [], store_mod._check_entry
    monkeypatch.setattr(store_mod, "_check_entry", lambda path, *a, **k: checked.append(path) or real(path, *a, **k))
    at = _app(root).run()
    assert len(_grid(at, "main_table")) == 5
    checked.clear()
    entry = next(root.glob("imagenet-star/*/result.json")).parent
    shutil.copy(entry / "result.json", entry / "predictions" / "result.json")
    shutil.copy(entry / "result.json", root / "imagenet-star" / "result.json")
    at.run()
    assert checked == [] and len(_grid(at, "main_table")) == 5
    first = json.loads((entry / "result.json").read_text())
    write_model(root, model_id="timm/new.model", architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=2.0,
                rng=np.random.default_rng(11), suite_id="imagenet-star", configs=CONFIGS,
                difficulty={c: np.random.default_rng(3).normal(0, 1.2, 60) for c in CONFIGS},
                manifest=first["suite"]["manifest_sha256"])
    at.run()
    assert "timm/new.model" in {p.parent.name.replace("--", "/") for p in checked}
    assert "timm/new.model" in set(_grid(at, "community_table")["model"])  # unsigned: shown, not ranked


def test_files_changed_while_the_board_is_drawn_are_checked_again_not_a_traceback(tmp_path, monkeypatch):
    """An entry's predictions file rewritten after a run's refresh, before its ranks are read for the board:
    the ranking's read refuses it (``Entry.recheck``), and the app checks the store again and draws it anew
    (the entry rejected, no longer ranked) instead of failing the page."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = _board(tmp_path / "s", models=4)
    victim = next(root.glob("*/*-v1/predictions/base.parquet"))
    model = json.loads((victim.parent.parent / "result.json").read_text())["model"]["id"]
    real, raised = aggregate.board_table, []

    def race(entries, **kw):  # the file changes between the app run's refresh and its ranking
        if not raised:
            data = bytearray(victim.read_bytes())
            data[len(data) // 2] ^= 0xFF
            victim.write_bytes(bytes(data))
            try:
                return real(entries, **kw)
            except Exception as e:
                raised.append(type(e).__name__)
                raise
        return real(entries, **kw)
    monkeypatch.setattr(aggregate, "board_table", race)
    from genshift.leaderboard import index
    monkeypatch.setattr(index, "write_index", lambda *a, **kw: None)  # its first view would read the ranks first
    at = _app(root).run()
    assert raised == ["IntegrityError"]  # the race happened: the ranking refused the changed file
    assert not at.exception, at.exception
    table = _grid(at, "main_table")
    assert model not in set(table["model"]) and len(table) == 5
    assert any("1 rejected" in t.value for t in at.text), [t.value for t in at.text]


def test_export_space_builds_and_renders(tmp_path, monkeypatch):
    from huggingface_hub import HfApi, constants

    from genshift.cli import main
    from genshift.eval import stamps
    from tests.fakehub import FakeHub

    root = _board(tmp_path / "s", models=4)
    stamps.generate_key(tmp_path / "k")
    with FakeHub() as hub:
        hub.create("dataset", "org/results")
        HfApi(endpoint=hub.endpoint).upload_folder(repo_id="org/results", repo_type="dataset", folder_path=str(root),
                                                   ignore_patterns=[".*"])
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        out = tmp_path / "space"
        assert main(["leaderboard", "--results", "org/results", "--trusted-keys", str(tmp_path / "k.pub"),
                     "--export-space", str(out)]) == 0
        sha = hub.repos[("dataset", "org/results")].refs["main"]
        card = (out / "README.md").read_text()
        assert card.startswith("---\n") and "sdk: streamlit" in card and "app_file: app.py" in card
        config = json.loads((out / "space.json").read_text())
        assert config["results"] == f"org/results@{sha}" and (out / config["trusted_keys"]).is_file()
        reqs = (out / "requirements.txt").read_text().split()
        assert all("==" in r for r in reqs) and any(r.startswith("streamlit==") for r in reqs)
        assert 'toolbarMode = "viewer"' in (out / ".streamlit" / "config.toml").read_text()
        assert (out / "pkg" / "genshift" / "leaderboard" / "app.py").is_file()
        assert (out / "pkg" / "genshift" / "_data" / "imagenet_hierarchy.json").is_file()
        assert main(["leaderboard", "--results", str(root), "--export-space", str(tmp_path / "x")]) != 0

        from streamlit.testing.v1 import AppTest
        from tests.test_leaderboard import _settle
        at = _settle(AppTest.from_file(str(out / "app.py"), default_timeout=120))
        assert not at.exception
        assert len(at.dataframe[0].value) == 6
        assert any(f"results store: org/results@{sha} |" in t.value for t in at.text)
    for k in ("GENSHIFT_TRUSTED_KEYS", "GENSHIFT_ID_ACCURACY"):
        os.environ.pop(k, None)


# Runs an exported Space in the environment its requirements.txt makes: the distributions it pins and,
# from installed metadata, what they depend on (markers evaluated, no extras) stay importable; every
# other installed distribution (torch, timm, this checkout's own install, optional extras such as
# trio) is hidden as if not installed. Prints what the board showed and what was hidden.
SPACE_AS_DEPLOYED = r"""
import importlib.metadata as md, json, re, sys, time
from pathlib import Path
from packaging.requirements import Requirement

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
todo, installs = [Requirement(r).name for r in Path("requirements.txt").read_text().split()], set()
while todo:
    name = norm(todo.pop())
    if name not in installs:
        installs.add(name)
        todo += [r.name for r in map(Requirement, md.requires(name) or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
own = {p.name for p in Path("pkg").iterdir()}
hidden = {m for m, ds in md.packages_distributions().items() if m not in own and not {norm(d) for d in ds} & installs}
asked = set()

class NotInstalled:
    def __init__(self, finder): self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            asked.add(name.partition(".")[0])
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, name): return getattr(self.finder, name)

before = set(sys.modules)
sys.meta_path[:] = [NotInstalled(f) for f in sys.meta_path]
import importlib.util
torch_findable = importlib.util.find_spec("torch") is not None
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=120)
at.run()
deadline = time.time() + 90
while at.get("progress") and time.time() < deadline:
    time.sleep(0.3)
    at.run()
tables = [d.value for d in at.dataframe]
df = next((t for t in tables if "verified" in t), None)  # the ranking (a board of rejected entries has none)
print(json.dumps({
    "exception": [str(e.value) for e in at.exception], "texts": [t.value for t in at.text],
    "tables": [t.astype(str).values.tolist() for t in tables],
    "models": [] if df is None else df["model"].tolist(), "verified": [] if df is None else df["verified"].tolist(),
    "leaderboard_from": sys.modules["genshift.leaderboard"].__file__, "torch_installed": "torch" in installs,
    "hidden_loaded": sorted({m.partition(".")[0] for m in set(sys.modules) - before} & hidden),
    "hidden_asked": sorted(asked), "torch_findable": torch_findable, "python": sys.executable,
}))
"""


def test_checking_and_painting_import_no_torch_and_no_datasets():
    """Import structure, in a fresh interpreter: the board (store, index, aggregate) and checking stored
    entries (genshift.eval.verify, stamps, suite_trust) import neither torch nor timm (a Space has neither)
    nor datasets (seconds of a restart's first paint; only reading suite rows needs it)."""
    import subprocess
    import sys

    code = ("import json, sys; import {}; print(json.dumps(sorted({{m.partition('.')[0] for m in sys.modules}} & "
            "{{'torch', 'timm', 'torchvision', 'datasets'}})))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    loaded = {}
    for mods in ("genshift.leaderboard.store, genshift.leaderboard.index, genshift.leaderboard.aggregate, genshift.leaderboard.export",
                 "genshift.eval.verify, genshift.eval.stamps, genshift.eval.suite_trust"):
        out = subprocess.run([sys.executable, "-c", code.format(mods)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        loaded[mods] = json.loads(out.stdout)
    assert list(loaded.values()) == [[], []], loaded


def test_exported_space_checks_every_entry_without_torch(tmp_path, toy_suite, tiny_checkpoint, tiny_id, monkeypatch):
    """The Space as deployed: its own requirements.txt has no torch, and checking stored entries (hashes,
    rows against the trusted suite, every metric recomputed, the stamp) must not need it. A real entry
    scored on a trusted suite and signed (`bench verify --recheck --sign`) is on the Hub stand-in; the
    exported app runs in a fresh process where only what requirements.txt installs can be imported
    (so a missing pin fails here too) and shows the entry verified."""
    import subprocess
    import sys

    from huggingface_hub import HfApi, constants

    from genshift.cli import main
    from genshift import evaluate
    from tests.fakehub import FakeHub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    key = tmp_path / "maintainer.key"
    assert main(["keygen", str(key)]) == 0
    assert main(["verify", str(rpath), "--recheck", "4", "--checkpoint", str(tiny_checkpoint), "--sign", str(key),
                 "--suite", str(toy_suite)]) == 0
    with FakeHub() as hub:
        hub.create("dataset", "org/results")
        HfApi(endpoint=hub.endpoint).upload_folder(repo_id="org/results", repo_type="dataset",
                                                   folder_path=str(tmp_path / "runs"), ignore_patterns=[".*"])
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        out = tmp_path / "space"
        assert main(["leaderboard", "--results", "org/results", "--trusted-keys", f"{key}.pub", "--suites",
                     str(toy_suite), "--export-space", str(out)]) == 0
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GENSHIFT_", "PYTHON"))}
        env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "space-hf"))  # a fresh Space: empty caches
        # GENSHIFT_SPACE_PYTHON: the python of a fresh venv made from an exported requirements.txt
        # (docs/leaderboard.md); by default this interpreter, with everything not pinned hidden
        python = os.environ.get("GENSHIFT_SPACE_PYTHON") or sys.executable
        run = subprocess.run([python, "-c", SPACE_AS_DEPLOYED], cwd=out, env=env, capture_output=True,
                             text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert not shown["exception"], shown["exception"]
    assert shown["leaderboard_from"].startswith(str(out / "pkg" / "genshift")), shown["leaderboard_from"]  # the Space's copy
    # torch is not among what requirements.txt installs, and the hiding ran: installed here, not found there
    import importlib.util
    assert importlib.util.find_spec("torch") is not None and not shown["torch_findable"]
    assert shown["python"] == (os.environ.get("GENSHIFT_SPACE_PYTHON") or sys.executable)
    assert not shown["torch_installed"] and shown["hidden_loaded"] == []
    assert shown["models"] == [tiny_id] and shown["verified"] == [True], shown["tables"]
    assert any("1 results (1 verified), 0 rejected" in t for t in shown["texts"]), shown["texts"]


def test_leaderboard_serves_in_viewer_mode():
    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS
    i = STREAMLIT_FLAGS.index("--client.toolbarMode")
    assert STREAMLIT_FLAGS[i + 1] == "viewer"


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (Linux /proc)."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - out)
            out |= kids
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads process trees from Linux /proc")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_bench_leaderboard_stops_its_server_on_signals(tmp_path, sig):
    """`bench leaderboard` in a real process: the Streamlit server it started serves the port; after the
    signal the port is closed and no process of the tree is left (SIGKILL: the server gets SIGTERM from
    the kernel when its parent dies)."""
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request

    from genshift.cli.leaderboard_cmd import port_free
    from tests.hubtools import free_port

    root = tmp_path / "s"
    make_store(root, models=2, configs=2, rows=20, seed=1)
    port = free_port()
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    bench = subprocess.Popen([sys.executable, "-m", "genshift", "leaderboard", "--results", str(root), "--port",
                              str(port)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    assert r.read() == b"ok"
                break
            except OSError:
                assert bench.poll() is None and time.time() < deadline, "the server never came up"
                time.sleep(0.3)
        tree = _children(bench.pid)
        assert tree, "the Streamlit server runs as a child of bench leaderboard"
        # a viewer's open connection: the stopping server closes it first, leaving its port in TIME_WAIT
        viewer = socket.create_connection(("127.0.0.1", port))
        viewer.sendall(b"GET /_stcore/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in viewer.recv(4096)
        bench.send_signal(getattr(signal, sig))
        rc = bench.wait(timeout=30)
        assert rc == (-signal.SIGKILL if sig == "SIGKILL" else 128 + getattr(signal, sig))
        deadline = time.time() + 20
        while any(_alive(p) for p in tree) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in tree if _alive(p)], "a server process outlived bench leaderboard"
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
        # and a restart may take the port at once (the served connections' TIME_WAIT does not block it)
        assert port_free("127.0.0.1", port)
        viewer.close()
    finally:
        if bench.poll() is None:
            bench.kill()
        for p in tree:  # what this test started, if it survived
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_diagnose_pictures_html_and_drilldown(tmp_path, toy_suite, tiny_checkpoint, monkeypatch):
    from genshift.cli import main
    from genshift.builders.tiny import tiny_open_clip
    from genshift.eval import embeddings
    from genshift import evaluate

    rpath = evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs",
                     workers=0, compile="off", progress=False).path
    # random weights get every image wrong; a failure direction needs both outcomes in a class, so the
    # stored predictions are made right on every other image, consistently (the label moved to the
    # front of the top-k), with hashes and metrics recomputed: diagnose and the store check them
    import pyarrow as pa
    import pyarrow.parquet as pq
    from genshift.fsutil import sha256_file
    r = json.loads(rpath.read_text())
    for p in r["predictions"]:
        f = rpath.parent / p["path"]
        t = pq.read_table(f)
        cols = {n: t[n].to_pylist() for n in ("topk_idx", "topk_prob", "true_prob", "true_rank", "label")}
        for j in range(0, t.num_rows, 2):
            y = cols["label"][j]
            cols["topk_idx"][j] = [y] + [i for i in cols["topk_idx"][j] if i != y][:len(cols["topk_idx"][j]) - 1]
            cols["topk_prob"][j] = [0.9] + cols["topk_prob"][j][:-1]
            cols["true_prob"][j], cols["true_rank"][j] = 0.9, 0
        for n in ("topk_idx", "topk_prob", "true_prob", "true_rank"):
            t = t.set_column(t.schema.get_field_index(n), n, pa.array(cols[n], type=t.schema.field(n).type))
        pq.write_table(t, f)
        p["sha256"] = sha256_file(f)
    from genshift.eval.predictions import read_predictions
    from genshift.eval.scoring import ScoringOptions, score
    r["metrics"] = score(r["suite"]["metric_family"], {p["config"]: read_predictions(rpath.parent / p["path"])
                                                       for p in r["predictions"]}, ScoringOptions(**r["protocol"]["scoring"]))
    rpath.write_text(json.dumps(r))
    model, _, _ = tiny_open_clip()
    import open_clip
    enc = embeddings.ClipEncoder(model, open_clip.tokenize, 32, (0.48, 0.46, 0.41), (0.27, 0.26, 0.28), "<b>clip</b>")
    monkeypatch.setattr(embeddings.ClipEncoder, "from_pretrained", classmethod(lambda cls, *a, **k: enc))
    assert main(["diagnose", str(rpath.parent), "--cache-dir", str(tmp_path / "cache"), "--null", "2",
                 "--criterion", "top3"]) == 0
    rep = json.loads((rpath.parent / "diagnose.json").read_text())
    ok = [c for c in rep["classes"] if c["status"] == "ok"]
    assert ok and rep["thumbnails"] and all(i in rep["thumbnails"] for i in ok[0]["hardest"][:6])
    page = (rpath.parent / "diagnose.html").read_text()
    assert "&lt;b&gt;clip&lt;/b&gt;" in page and "<b>clip</b>" not in page  # data text escaped
    assert page.count("data:image/jpeg;base64,") >= len(ok[0]["hardest"][:6]) and "http" not in page.split("<body>")[1]
    assert "strength" in page and "permutation null" in page

    at = _app(tmp_path / "runs", trusted_keys=None).run()
    assert not at.exception
    assert any("Failure directions" in s.value for s in at.subheader), ([e.value for e in at.error], [t.value for t in at.text])
    assert len(at.get("image")) >= 1
    assert any("strength" in t.value and "null p95" in t.value for t in at.text)

    bad = dict(rep, thumbnails={ok[0]["hardest"][0]: "PHN2Zz48L3N2Zz4="})  # "<svg></svg>", not a raster image
    (rpath.parent / "diagnose.json").write_text(json.dumps(bad))
    from genshift.eval.diagnose_report import load_report_for_view
    view = load_report_for_view(rpath.parent)
    assert ok[0]["hardest"][0] not in view["thumbnails"]
    (rpath.parent / "diagnose.json").write_text("[" * 100000)
    assert load_report_for_view(rpath.parent) is None


def _fake_diagnose(run_dir, model_id):
    """A diagnose.json as `bench diagnose` writes it (two classes, thumbnails of real JPEGs)."""
    import base64
    import io

    from PIL import Image

    def jpeg(color):
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), color).save(buf, format="JPEG")
        return base64.b64encode(buf.getvalue()).decode()
    classes = [{"label": 207, "name": "golden retriever", "wnid": "n02099601", "status": "ok", "n": 40, "n_errors": 12,
                "strength": 0.81, "null_p95": 0.55, "null_mean": 0.5, "hardest": ["h1", "h2"], "easiest": ["e1"],
                "hard_captions": [["a photo of a canine in the snow", -1.0]], "easy_captions": []}]
    report = {"kind": "genshift-diagnose", "schema_version": 1, "model": model_id, "classes": classes,
              "thumbnails": {"h1": jpeg("red"), "h2": jpeg("blue"), "e1": jpeg("green")}}
    (run_dir / "diagnose.json").write_text(json.dumps(report))


def _chrome():
    import shutil
    return shutil.which("chromium") and shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(not _chrome(), reason="Debian chromium + chromium-driver are not installed")
def test_real_browser_deep_links_intervals_and_pictures(tmp_path):
    pytest.importorskip("selenium")
    import subprocess
    import sys

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import chromium, open_when_serving, until_checked

    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS
    from tests.hubtools import free_port
    from tests.test_leaderboard import APP

    root = _board(tmp_path / "s")
    _fake_diagnose(root / "imagenet-star" / "timm--tie_b.in1k", "timm/tie_b.in1k")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GENSHIFT_ID_ACCURACY"}  # trusts _board's key
    env["GENSHIFT_RESULTS"] = str(root)
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.port", str(port),
                               "--server.address", "127.0.0.1", *STREAMLIT_FLAGS], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = chromium(tmp_path / "chrome")
    body = lambda d: d.find_element(By.TAG_NAME, "body").text  # noqa: E731
    try:
        url = f"http://127.0.0.1:{port}/?suite=imagenet-star&tab=Model+drilldown&model=timm%2Ftie_b.in1k&params=5.0&params=20.0"
        # the page itself notes when the first table cell and the first chart enter the DOM (polling from
        # here could miss the moment on a loaded machine)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
            window.__first = {};
            new MutationObserver(() => {
              const t = performance.now(), f = window.__first;
              if (f.cell === undefined && document.querySelector("[data-testid='stDataFrame'] [role=gridcell]")) f.cell = t;
              if (f.chart === undefined && document.querySelector("[data-testid=stPlotlyChart]")) f.chart = t;
            }).observe(document, {childList: true, subtree: true});"""})
        open_when_serving(driver, url)
        # first paint: the ranking table before any chart (the charts come in the run after it was painted)
        charts = "return document.querySelectorAll('[data-testid=stPlotlyChart]').length"
        WebDriverWait(driver, 180).until(lambda d: d.execute_script(charts) > 0)
        first = driver.execute_script("return window.__first")
        assert first.get("cell") is not None and first["cell"] < first["chart"], first
        until_checked(driver)
        WebDriverWait(driver, 180).until(lambda d: "strength 0.810" in body(d) and "Top 10 as text" in body(d))
        text = body(driver)
        assert "golden retriever" in text and "strength 0.810" in text, text
        boxes = driver.execute_script("return Array.from(document.querySelectorAll('[data-testid=stSelectbox]'))"
                                      ".map(s => s.textContent + ' ' + Array.from(s.querySelectorAll('input'))"
                                      ".map(i => i.value + ' ' + (i.getAttribute('aria-label') || '')).join(' '))")
        assert any("timm/tie_b.in1k" in b for b in boxes), boxes
        imgs = driver.find_elements(By.CSS_SELECTOR, "[data-testid='stImage'] img")
        WebDriverWait(driver, 30).until(lambda d: all(i.get_property("naturalWidth") > 0 for i in imgs) and imgs)
        assert len(imgs) == 3
        assert "Deploy" not in text and "Stop" not in body(driver)  # viewer mode
        # the deep link survived: still in the URL, the slider shows it
        assert "model=timm%2Ftie_b.in1k" in driver.current_url and "params=5.0" in driver.current_url
        # the table's interval columns (the grid's header is drawn on a canvas; its accessible table has them)
        grid = driver.find_element(By.CSS_SELECTOR, "[data-testid='stDataFrame']")
        headers = driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('[role=columnheader]')).map(h => h.textContent)", grid)
        assert any("95% lo" in h for h in headers) and any("95% hi" in h for h in headers), headers
        cells = driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('[role=gridcell]')).map(c => c.textContent)", grid)
        assert cells and "None" not in cells
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=10)


def test_trusted_suites_reject_entries_on_other_suite_data(tmp_path, toy_suite, capsys, monkeypatch):
    """`bench leaderboard --suites DIR`: every entry is checked against a trusted manifest; the synthetic
    board's entries name a suite that is not among them, so all are rejected with the reason."""
    from genshift.cli import main
    from genshift.leaderboard.index import Loader
    from genshift.leaderboard.space import _copy_trusted_manifests

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # the index lives there: no state from other tests
    root = _board(tmp_path / "s", models=3)
    open_loader = Loader(str(root))
    assert open_loader.wait(120)
    store, _ = open_loader.snapshot()
    assert len(store.entries) == 5 and not store.rejected  # no trusted suites given: shown, not checked
    strict = Loader(str(root), suites_dir=str(toy_suite))
    assert strict.wait(120)
    store, _ = strict.snapshot()
    assert not store.entries and len(store.rejected) == 5
    assert all("trusted" in e.reason or "suite" in e.reason for e in store.rejected)
    # the index is used again under the same trusted suites, and not once a manifest of them changed
    # (what the loader starts from; its background check, which would move the kind on, is not run)
    monkeypatch.setattr(Loader, "_run", lambda self: None)
    assert Loader(str(root), suites_dir=str(toy_suite)).kind == "index"  # (no first view: nothing shown)
    manifest = toy_suite / "manifest.json"
    saved = manifest.read_bytes()
    try:
        manifest.write_bytes(saved)  # the same bytes rewritten: its stat key moved, the index is not trusted
        assert Loader(str(root), suites_dir=str(toy_suite)).kind == "none"
    finally:
        manifest.write_bytes(saved)

    assert main(["leaderboard", "--results", str(root), "--suites", str(tmp_path / "nowhere")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    # a Space gets the trusted manifests only, byte for byte, named by their sha256
    _copy_trusted_manifests(toy_suite, tmp_path / "space-suites")
    (copied,) = (tmp_path / "space-suites").iterdir()
    from genshift.fsutil import sha256_file
    assert copied.name == f"{sha256_file(toy_suite / 'manifest.json')}.json"
    assert copied.read_bytes() == (toy_suite / "manifest.json").read_bytes()


WHAT_IS_RANKED = re.compile(r"^## What is ranked\n(.*?)\n## ", re.S | re.M)


def _mixed_store(root, key):
    """One board with every kind of entry, and a second suite with more (unverified) entries than it."""
    make_store(root, models=4, configs=3, rows=30, seed=6)
    first = json.loads(next(root.glob("*/*/result.json")).read_text())
    difficulty = {c: np.random.default_rng(6).normal(0, 1.2, 30) for c in CONFIGS}
    common = dict(suite_id="imagenet-star", difficulty=difficulty, manifest=first["suite"]["manifest_sha256"],
                  architecture="resnet50", tag="a1_in1k", num_params=25e6)
    # make_store's image ids and labels, so rank intervals can pair every entry
    sign_all(root, key)
    write_model(root, model_id="timm/community.model", configs=CONFIGS, skill=5.0, rng=np.random.default_rng(1),
                **common)
    partial = write_model(root, model_id="timm/partial.model", configs=CONFIGS[:2], skill=5.0,
                          rng=np.random.default_rng(2), flags={"partial": True}, **common)
    stale = write_model(root, model_id="timm/stale.model", configs=CONFIGS, skill=5.0, rng=np.random.default_rng(3),
                        **common)
    construction = write_model(root, model_id="timm/construction.model", configs=CONFIGS, skill=5.0,
                               rng=np.random.default_rng(4), flags={"construction_model": True}, **common)
    for p in (partial, stale, construction):
        _sign_stamp(p, key)  # a maintainer's stamp: partial, construction and stale entries are still not ranked
    r = json.loads(stale.read_text())
    r["notes"] = "edited after signing"
    stale.write_text(json.dumps(r))
    v0 = first["model"]
    copy = write_model(root, model_id="timm/renamed.copy", configs=CONFIGS, skill=1.0, rng=np.random.default_rng(5),
                       weights_sha256=v0["weights_sha256"], **common)
    _sign_stamp(copy, key)
    # a resubmission of a verified model: unsigned, claims to be the newest
    newest = write_model(root / "_dup", model_id=v0["id"], configs=CONFIGS, skill=9.0, rng=np.random.default_rng(8),
                         finished_at="9999-12-31T23:59:59+00:00", **common)
    os.rename(newest.parent, root / "imagenet-star" / "aaa-newest-copy")
    shutil.rmtree(root / "_dup")
    # more entries (none verified) on a suite whose id sorts first
    make_store(root, models=6, configs=2, rows=20, seed=9, suite_id="aaa-suite")
    return root


def test_what_is_ranked_as_documented(tmp_path, capsys):
    """Each numbered sentence of docs/leaderboard.md "What is ranked", shown on one store in the app."""
    from genshift.leaderboard.store import load_store

    doc = (Path(__file__).resolve().parents[1] / "docs" / "leaderboard.md").read_text()
    claims = re.findall(r"^(\d+)\. (.+)$", WHAT_IS_RANKED.search(doc).group(1), re.M)
    assert [int(n) for n, _ in claims] == list(range(1, 12))  # a new sentence needs a check below
    key = tmp_path / "maintainer.key"
    root = _mixed_store(tmp_path / "s", key)
    store = load_store(str(root), trusted_keys=f"{key}.pub")
    at = _app(root).run()
    assert not at.exception
    main, community = _grid(at, "main_table"), _grid(at, "community_table")
    honest = {f"timm/{a}.{t}-v{i}" for i, (a, t, _) in enumerate(ARCHS[:4])}

    # 1. only verified and complete entries, ranked among themselves (1..n)
    assert set(main["model"]) == honest | {"timm/renamed.copy"} and list(main["rank"]) == list(range(1, 6))
    # 2. a stale stamp does not count
    why = community.set_index("model")["not_ranked_because"]
    assert why["timm/stale.model"].startswith("not verified") and "stale" in why["timm/stale.model"]
    # 3. complete: a signed partial entry is not ranked, and `verify --sign` refuses one (make_stamp's rule)
    assert "partial" in why["timm/partial.model"] and community.set_index("model").loc["timm/partial.model", "partial"]
    from genshift.cli import main as bench
    capsys.readouterr()
    assert bench(["verify", str(root / "imagenet-star" / "timm--partial.model"), "--recheck", "1", "--sign",
                  str(key)]) != 0
    assert "--sign refused" in capsys.readouterr().err and "partial" in why["timm/partial.model"]
    # 4. rank intervals over the same set: exactly what the ranked entries alone give
    ranked = [e for e in store.for_suite("imagenet-star") if e.model_id in set(main["model"])]
    alone = aggregate.rank_intervals(ranked, family="imagenet_star", configs=CONFIGS[1:])
    assert {m: (r.rank, r.lo, r.hi) for m, r in alone.items()} == {
        m: (r, lo, hi) for m, r, lo, hi in zip(main["model"], main["rank"], main["rank_lo"], main["rank_hi"])}
    # 5. everything else: a separate, labelled table with numbers and flags, no rank (construction models on demand)
    assert set(community["model"]) == {"timm/community.model", "timm/partial.model", "timm/stale.model"}
    assert "rank" not in community.columns and community["mean_shift_acc1"].notna().all()
    assert community["mean_shift_acc1"].min() > main["mean_shift_acc1"].max()  # better numbers, still unranked
    assert any(s.value == "Community entries (not verified, not ranked)" for s in at.subheader)
    at.checkbox(key="construction").check().run()
    assert "timm/construction.model" in set(_grid(at, "community_table")["model"])
    assert _grid(at, "main_table").equals(main)
    at.checkbox(key="construction").uncheck().run()
    # 6. a board with no verified entries says so and ranks nothing
    at.selectbox(key="suite").select("aaa-suite").run()
    assert any("nothing is ranked" in i.value for i in at.info) and _grid(at, "main_table") is None
    assert len(_grid(at, "community_table")) == 6
    at.selectbox(key="suite").select("imagenet-star").run()
    # 7. filters hide rows, never re-rank, and the caption says how many ranked entries are shown
    at.multiselect(key="family").select("convnext").run()
    f = _grid(at, "main_table")
    assert len(f) == 1 and f["rank"].iloc[0] == main.set_index("model").loc[f["model"].iloc[0], "rank"]
    assert any("Ranks are among the 5 verified, complete entries of this board; 1 shown after the filters" in c.value
               for c in at.caption)
    at.multiselect(key="family").unselect("convnext").run()
    # 8. a newer-claiming unsigned copy filed under another folder is rejected; the verified entry is shown
    (copy,) = [e for e in store.rejected if e.path.parent.name == "aaa-newest-copy"]
    assert "belongs under imagenet-star/" in copy.reason and not store.superseded
    claimed = json.loads(copy.path.read_text())
    shown = next(e for e in store.for_suite("imagenet-star") if e.model_id == claimed["model"]["id"])
    assert shown.verified and shown.result["finished_at"] < claimed["finished_at"]
    # (the precedence among entries that still meet: tests/test_leaderboard.py::test_superseding_is_decided_by_...)
    # 9. the same weights under two ids: flagged in the table and in the Rejected tab
    flagged = main.set_index("model")["flags"]
    assert "timm/renamed.copy" in flagged[shown.model_id] and shown.model_id in flagged["timm/renamed.copy"]
    rejected = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    flagged_entries = set(rejected.loc[rejected["status"] == "flagged", "entry"])
    assert {str(shown.path.relative_to(root)), "imagenet-star/timm--renamed.copy/result.json"} <= flagged_entries
    # 10. the default suite has the most verified entries (aaa-suite has more entries and sorts first)
    assert store.suites()[0] == "imagenet-star" and _app(root).run().selectbox(key="suite").value == "imagenet-star"
    # 11. a running board re-checks changed files before drawing: a swapped predictions file loses its rank
    victim = main["model"].iloc[0]
    vdir = next(e.run_dir for e in store.for_suite("imagenet-star") if e.model_id == victim)
    donor = next(e.run_dir for e in store.for_suite("imagenet-star") if e.model_id == main["model"].iloc[-1])
    shutil.copyfile(donor / "predictions" / "shift_01.parquet", vdir / "predictions" / "shift_01.parquet")
    at.run()
    assert victim not in set(_grid(at, "main_table")["model"])
    rejected = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    assert any(vdir.name in e and "does not verify" in r for e, r in zip(rejected["entry"], rejected["reason"]))


def test_badge_follows_the_files_under_a_running_board(tmp_path, monkeypatch):
    """The loader re-checks exactly the entries whose files changed (a stat per file otherwise), before the
    app draws: a removed stamp, an in-place rewrite that keeps size and mtime, a new diagnose.json; and a
    restarted server painting from its index re-checks files changed while it was down."""
    from genshift.leaderboard import index, store as store_mod

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # the index lives there: no state from other tests
    root = _board(tmp_path / "s", models=3)
    rechecked, real = [], store_mod._check_entry
    monkeypatch.setattr(store_mod, "_check_entry", lambda path, *a, **k: rechecked.append(path) or real(path, *a, **k))
    at = _app(root).run()
    main = _grid(at, "main_table")
    assert len(main) == 5 and main["verified"].all()
    rechecked.clear()
    at.run()
    assert rechecked == []  # nothing changed: stat keys only, no hashing, no check
    run = {m: root / "imagenet-star" / m.replace("/", "--") for m in main["model"]}
    stamp_gone, rewritten = main["model"].iloc[0], main["model"].iloc[1]
    f = run[rewritten] / "predictions" / "shift_02.parquet"
    st_ = f.stat()
    with open(f, "r+b") as fh:  # same size, same inode, and the mtime put back: only ctime moves
        fh.seek(st_.st_size // 2)
        b = fh.read(1)
        fh.seek(st_.st_size // 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    os.utime(f, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ino) == (st_.st_size, st_.st_mtime_ns, st_.st_ino)
    at.run()
    assert [p.parent.name for p in rechecked] == [run[rewritten].name]  # only the changed entry
    assert rewritten not in set(_grid(at, "main_table")["model"])
    (run[stamp_gone] / "verification.json").unlink()  # (a stamp change also starts a full background check)
    at.run()
    main, community = _grid(at, "main_table"), _grid(at, "community_table")
    assert stamp_gone not in set(main["model"]) and rewritten not in set(main["model"])
    assert community.set_index("model").loc[stamp_gone, "not_ranked_because"].startswith("not verified")
    rejected = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    assert any(run[rewritten].name in e and "sha256" in r for e, r in zip(rejected["entry"], rejected["reason"]))

    # a diagnose.json added under the running board: re-checked, drawn, a weak direction marked as such
    target = main["model"].iloc[0]
    _fake_diagnose(run[target], target)
    report = json.loads((run[target] / "diagnose.json").read_text())
    report["classes"].append(dict(report["classes"][0], label=1, name="goldfish", strength=0.52, null_p95=0.55,
                                  hard_captions=[["a photo of noise", -1.0]]))
    (run[target] / "diagnose.json").write_text(json.dumps(report))
    rechecked.clear()
    at.selectbox(key="model").select(target).run()
    assert [p.parent.name for p in rechecked] == [run[target].name]
    texts = [t.value for t in at.text]
    assert "hard images: a photo of a canine in the snow" in texts and not any("a photo of noise" in t for t in texts)
    assert any(t.startswith("not significant") for t in texts)

    # a restarted server paints from its index; a file changed while it was down is re-checked before drawing
    full = index.Loader(str(root), trusted_keys_file=os.environ["GENSHIFT_TRUSTED_KEYS"])
    assert full.wait(60) and index.index_path(root).is_file()
    victim = main["model"].iloc[-1]
    shutil.copyfile(run[rewritten] / "predictions" / "base.parquet", run[victim] / "predictions" / "base.parquet")
    restarted = index.Loader(str(root), trusted_keys_file=os.environ["GENSHIFT_TRUSTED_KEYS"])
    painted, state = restarted.snapshot()
    # no first view from the head (a file changed); from the body, the changed entry is left out until checked
    assert restarted.first_view() is None and state["kind"] == "index"
    assert not any(e.model_id == victim for e in painted.entries)
    assert len(painted.entries) == len(full.snapshot()[0].entries) - 1
    assert restarted.wait(60)
    fresh = restarted.snapshot()[0]
    assert not any(e.model_id == victim for e in fresh.entries)
    assert any(e.model_id == victim and "does not verify" in e.reason for e in fresh.rejected)


@pytest.mark.browser
@pytest.mark.skipif(not _chrome(), reason="Debian chromium + chromium-driver are not installed")
def test_real_browser_swapped_predictions_lose_their_rank_without_a_restart(tmp_path):
    """A real server and headless Chromium: restarted over its checked store, the server paints its first
    page from the index's head (the page says so) with the same ranking; then a model's predictions file
    replaced by another model's while the server runs: on reload the model is no longer ranked (and the
    server was not restarted again)."""
    pytest.importorskip("selenium")
    import subprocess
    import sys

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.browser import chromium, open_when_serving, until_checked

    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS
    from tests.hubtools import free_port
    from tests.test_leaderboard import APP

    root = _board(tmp_path / "s", models=4)
    env = {**{k: v for k, v in os.environ.items() if k != "GENSHIFT_ID_ACCURACY"}, "GENSHIFT_RESULTS": str(root),
           "HF_HOME": str(tmp_path / "hf")}

    def start():
        port = free_port()
        return port, subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.port", str(port),
                                       "--server.address", "127.0.0.1", *STREAMLIT_FLAGS], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port, server = start()
    driver = chromium(tmp_path / "chrome", window="1400,1000")
    body = lambda d: d.find_element(By.TAG_NAME, "body").text  # noqa: E731

    def top10():
        until_checked(driver)
        WebDriverWait(driver, 180).until(lambda d: "Top 10 as text" in body(d))
        time.sleep(1)
        driver.find_element(By.XPATH, "//*[contains(text(), 'Top 10 as text')]").click()
        WebDriverWait(driver, 30).until(lambda d: "timm/" in d.find_element(
            By.CSS_SELECTOR, "[data-testid='stExpander']").text)
        text = driver.find_element(By.CSS_SELECTOR, "[data-testid='stExpander']").text
        return [line.split()[1] for line in text.splitlines() if line.strip()[:1].isdigit()]

    try:
        open_when_serving(driver, f"http://127.0.0.1:{port}/?suite=imagenet-star")
        before = top10()
        assert len(before) == 6, before
        server.terminate()
        server.wait(timeout=30)
        port, server = start()  # restarted: the first page comes from the head, then the whole board
        open_when_serving(driver, f"http://127.0.0.1:{port}/?suite=imagenet-star")
        # the page painted from the head: its message and its table on screen together
        WebDriverWait(driver, 120).until(lambda d: "the rest of the board follows" in body(d) and d.execute_script(
            "return !!document.querySelector(\"[data-testid='stDataFrame']\")"))
        assert top10() == before
        victim, donor = before[0], before[-1]
        slug = lambda m: m.replace("/", "--")  # noqa: E731
        shutil.copyfile(root / "imagenet-star" / slug(donor) / "predictions" / "shift_01.parquet",
                        root / "imagenet-star" / slug(victim) / "predictions" / "shift_01.parquet")
        driver.refresh()
        after = top10()
        assert victim not in after and len(after) == 5, after
        assert server.poll() is None  # the same server process throughout
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=10)


def test_cold_board_says_how_much_is_ranked_and_keeps_pending_selections(tmp_path, monkeypatch):
    """A never-seen store is painted while it is checked: the board says it ranks only what was checked so
    far, and a shared link's model/family (naming entries not checked yet) stay in the URL until they apply."""
    from streamlit.testing.v1 import AppTest

    from genshift.leaderboard import index
    from tests.test_leaderboard import APP

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no index: a cold start
    root = _board(tmp_path / "s")
    real = index.load_store

    def slow(source, progress=None, **kw):  # a big store: every entry takes a while to check
        return real(source, progress=lambda i, n, e: (time.sleep(0.4), progress(i, n, e)), **kw)
    monkeypatch.setattr(index, "load_store", slow)
    monkeypatch.setattr(index.Loader, "PUBLISH_EVERY_S", 0.0)
    os.environ["GENSHIFT_RESULTS"] = str(root)
    at = AppTest.from_file(APP, default_timeout=120)
    late = "timm/vit_base_patch16_224.augreg_in21k_ft_in1k-v7"  # its folder sorts last: checked last
    at.query_params["family"] = "vit"
    at.query_params["model"] = late
    at.query_params["tab"] = "Model drilldown"
    at.run()
    assert not at.exception and at.get("progress")
    cold = [t.value for t in at.text if t.value.startswith("ranking the ")]
    assert cold and " of 10 entries checked so far" in cold[0], [t.value for t in at.text]
    assert dict(at.query_params) == {"family": "vit", "model": late, "tab": "Model drilldown"}  # pending: kept
    deadline = time.time() + 60
    while at.get("progress") and time.time() < deadline:
        time.sleep(0.5)
        at.run()
    assert not at.get("progress") and not any(t.value.startswith("ranking the ") for t in at.text)
    assert at.slider(key="params").value == (0.0, 87.0)  # the untouched range grew with the board (vit: 86.6 M)
    assert at.multiselect(key="family").value == ["vit"] and at.selectbox(key="model").value == late
    assert set(_grid(at, "main_table")["family"]) == {"vit"}
