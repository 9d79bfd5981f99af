"""The page, under Streamlit's AppTest: what is ranked (docs/leaderboard.md, every numbered rule), a grid people
can read, downloads, deep links, inert data text, an honest view while reading, and one line for a store that
cannot be opened."""

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from genshift.eval.results import write_result
from genshift.identity import folder_name
from genshift.leaderboard.store import load_store
from tests.boardkit import app, board, common, download, fresh_caches, grid, key_of, move, table, texts  # noqa: F401
from tests.synthetic_store import ARCHS, make_store, sign_entry, write_model

WHAT_IS_RANKED = re.compile(r"^## What is ranked\n(.*?)\n## ", re.S | re.M)
MARKDOWN = "[click](https://evil.example) ![i](https://evil.example/a.png) **bold** <script>alert(1)</script>"


def _mixed(root: Path) -> Path:
    """One board with every kind of entry, and a second suite with more (unverified) entries than it."""
    make_store(root, models=4, configs=3, rows=30, seed=6)
    for p in sorted(root.glob("*/*/result.json")):
        sign_entry(p, key_of(root))
    kw = dict(architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=5.0)
    write_model(root, model_id="timm/community.model", rng=np.random.default_rng(1), **common(root), **kw)
    for name, flags in (("partial", {"partial": True}), ("stale", {}), ("construction", {"construction_model": True})):
        p = write_model(root, model_id=f"timm/{name}.model", rng=np.random.default_rng(2), flags=flags,
                        **common(root), **kw)
        sign_entry(p, key_of(root))  # a maintainer's record: partial, construction and stale entries still not ranked
    stale = root / "imagenet-star" / "timm--stale.model" / "result.json"
    r = json.loads(stale.read_text())
    r["notes"] = "edited after signing"
    write_result(stale, r)
    first = json.loads((root / "imagenet-star" / "timm--resnet50.a1_in1k-v0" / "result.json").read_text())["model"]
    local = write_model(root, model_id=f"resnet50@sha256:{first['tensors_sha256'][:16]}", source="checkpoint",
                        tensors_sha256=first["tensors_sha256"], rng=np.random.default_rng(3), **common(root),
                        **{**kw, "skill": 1.0})
    sign_entry(local, key_of(root))  # the same weights, scored locally: listed once, under the Hub entry
    bad = write_model(root, model_id="timm/renamed.model", rng=np.random.default_rng(4), **common(root), **kw)
    r = json.loads(bad.read_text())
    r["model"]["id"] = "TIMM/resnet50.a1_in1k-v0 "  # not the canonical id of the weights it records
    bad.write_text(json.dumps(r))
    newest = write_model(root / "_dup", model_id=first["id"], finished_at="9999-12-31T23:59:59+00:00",
                         rng=np.random.default_rng(8), **common(root), **kw)
    move(newest, root / "imagenet-star" / "aaa-newest-copy")  # an unsigned copy filed under another folder
    shutil.rmtree(root / "_dup")
    make_store(root, models=6, configs=2, rows=20, seed=9, suite_id="aaa-suite")  # more entries, none verified
    return root


def test_what_is_ranked_as_documented(tmp_path, capsys, monkeypatch):
    """Each numbered rule of docs/leaderboard.md "What is ranked", shown on one store in the page."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "leaderboard.md").read_text()
    claims = re.findall(r"^(\d+)\. (.+)$", WHAT_IS_RANKED.search(doc).group(1), re.M)
    assert [int(n) for n, _ in claims] == list(range(1, 13))  # a new rule needs a check below
    root = _mixed(tmp_path / "s")
    keys = f"{key_of(root)}.pub"
    store = load_store(str(root), trusted_keys=keys)
    at = app(root, trusted_keys=keys, query={"tab": "Rejected"})
    assert not at.exception
    main, community = grid(at, "main"), grid(at, "community")
    honest = {f"timm/{a}.{t}-v{i}" for i, (a, t, _) in enumerate(ARCHS[:4])}

    # 1. only verified and complete entries, ranked among themselves (1..n)
    assert set(main["model"]) == honest and list(main["rank"]) == [1, 2, 3, 4]
    # 2. a record signed for another result.json (stale) does not count
    why = community.set_index("model")["not_ranked_because"]
    assert why["timm/stale.model"].startswith("not verified") and "stale" in why["timm/stale.model"]
    # 3. complete: a signed partial entry is not ranked, and `verify --sign` refuses one (make_stamp's rule)
    assert "partial" in why["timm/partial.model"]
    from genshift.cli import main as bench
    capsys.readouterr()
    assert bench(["verify", str(root / "imagenet-star" / "timm--partial.model"), "--recheck", "1", "--sign",
                  str(key_of(root))]) != 0
    assert "--sign refused" in capsys.readouterr().err
    # 4. rank intervals over the same set: exactly what the ranked entries' records alone give
    from genshift.leaderboard import aggregate
    ranked = [e for e in store.for_suite("imagenet-star") if e.model_id in honest]
    alone = aggregate.rank_intervals(ranked, family="imagenet_star", configs=["shift_01", "shift_02"])
    assert {m: (r.rank, r.lo, r.hi) for m, r in alone.items()} == {
        m: (r, lo, hi) for m, r, lo, hi in zip(main["model"], main["rank"], main["rank_lo"], main["rank_hi"])}
    # 5. everything else: a separate, labelled table with numbers and flags, no rank (construction models on demand)
    assert set(community["model"]) == {"timm/community.model", "timm/partial.model", "timm/stale.model"}
    assert "rank" not in community.columns and community["mean_shift_acc1"].notna().all()
    assert community["mean_shift_acc1"].min() > main["mean_shift_acc1"].max()  # better numbers, still unranked
    assert "Community entries (not verified, not ranked)" in [s.value for s in at.subheader]
    at.checkbox(key="construction").check().run()
    assert "timm/construction.model" in set(grid(at, "community")["model"]) and grid(at, "main").equals(main)
    at.checkbox(key="construction").uncheck().run()
    # 6. a board with no verified entries says so and ranks nothing (6b, while reading: test_reading_...)
    at.selectbox(key="suite").select("aaa-suite").run()
    assert any("nothing is ranked" in i.value for i in at.info) and grid(at, "main") is None
    assert len(grid(at, "community")) == 6
    at.selectbox(key="suite").select("imagenet-star").run()
    # 7. filters and search hide rows, never re-rank, and the caption says how many ranked entries are shown
    at.text_input(key="q").input("CONVNEXT").run()
    f = grid(at, "main")
    assert list(f["model"]) == ["timm/convnext_tiny.fb_in1k-v2"]
    assert f["rank"].iloc[0] == main.set_index("model").loc[f["model"].iloc[0], "rank"]
    assert any("Ranks are among the 4 verified, complete entries of this board; 1 shown after the filters" in c.value
               for c in at.caption)
    at.text_input(key="q").input("").run()
    # 8. keyed by canonical identity: a non-canonical id and a misfiled copy are rejected with the reason
    rejected = table(at, "reason").set_index("entry")
    reasons = {Path(e).parent.name: r for e, r in rejected["reason"].items()}
    assert "not a canonical id" in reasons["timm--renamed.model"]
    assert "belongs under imagenet-star/timm--resnet50.a1_in1k-v0/" in reasons["aaa-newest-copy"]
    # 9. the same weights under two ids: listed and ranked once, the Hub entry, flagged; the copy superseded
    local_id = next(e.model_id for e in store.superseded)
    assert "timm/resnet50.a1_in1k-v0" in set(main["model"]) and local_id not in set(main["model"])
    assert local_id in main.set_index("model").loc["timm/resnet50.a1_in1k-v0", "flags"]
    assert "Hub weights win over a local copy" in reasons[folder_name(local_id)]
    # 10. local weights: never under a Hub id (tests/test_board_record.py::test_local_weights_are_never_shown_...)
    assert (main["weights"] == "Hub").all() and local_id.startswith("resnet50@sha256:")
    # 11. the default suite and board have the most verified entries (aaa-suite has more entries and sorts first);
    # another protocol is a board of its own: tests/test_board_record.py::test_another_protocol_is_a_board_...
    assert store.suites()[0] == "imagenet-star" and app(root, trusted_keys=keys).selectbox(key="suite").value == \
        "imagenet-star"
    # 12. a predictions file read by a view and found changed: the entry is stale at once, without a restart
    victim, donor = main["model"].iloc[0], main["model"].iloc[-1]
    shutil.copyfile(root / "imagenet-star" / folder_name(donor) / "predictions" / "shift_01.parquet",
                    root / "imagenet-star" / folder_name(victim) / "predictions" / "shift_01.parquet")
    at = app(root, trusted_keys=keys, query={"tab": "Model drilldown", "model": victim})
    assert victim not in set(grid(at, "main")["model"])
    assert "stale" in grid(at, "community").set_index("model").loc[victim, "not_ranked_because"]


def test_a_grid_people_can_read(tmp_path):
    root = board(tmp_path / "s", models=6, extra=[("timm/papered.in1k", dict(
        architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=1.0, paper_ids="arXiv:2110.00476"))])
    write_model(root, model_id="timm/unsigned.in1k", architecture="vit_small", tag="in1k", num_params=22e6,
                skill=0.5, rng=np.random.default_rng(3), **common(root))
    at = app(root, trusted_keys=f"{key_of(root)}.pub")
    main, community = grid(at, "main"), grid(at, "community")
    protos = {tuple(json.loads(d.proto.columns)): d.proto for d in at.dataframe}
    main_cols = json.loads(next(d for d in at.dataframe if list(d.value.columns)[0] == "rank").proto.columns)
    # one precision per column, one decimal for percentages; the unit in the header
    assert main_cols["mean_shift_acc1"]["type_config"]["format"] == "%.1f"
    assert main_cols["mean_shift_acc1"]["label"] == "mean shift acc@1 (%)"
    assert {main_cols[c]["type_config"]["format"] for c in main_cols if c.startswith(("acc1/", "mean_shift"))
            or c == "base_acc1"} == {"%.1f"}
    assert main_cols["rank"]["type_config"]["format"] == "%d"
    # base accuracy next to the headline; a verified badge as text, not a checkbox
    assert list(main.columns[:7]) == ["rank", "model", "mean_shift_acc1", "mean_shift_acc1_lo", "mean_shift_acc1_hi",
                                      "base_acc1", "verified"]
    assert main["verified"].eq("✓ verified").all() and community["verified"].eq("✗ not verified").all()
    assert main_cols.get("verified", {}).get("type_config", {}).get("type") != "checkbox"
    # a missing value is shown as "-", never None or nan; the reason column is wide
    assert all(p.placeholder == "-" for p in protos.values())
    assert community["mean_shift_acc1_lo"].isna().all()  # the community's intervals: shown as "-"
    community_cols = json.loads(next(d for d in at.dataframe if "not_ranked_because" in d.value.columns).proto.columns)
    assert community_cols["not_ranked_because"]["width"] == "large"
    # per-shift columns by default; the column picker adds model details, with the Hub's links
    assert {"acc1/shift_01", "acc1/shift_02"} <= set(main.columns) and "acc1/base" not in main.columns
    at.multiselect(key="columns").select("model details").unselect("per-shift acc@1").run()
    main = grid(at, "main").set_index("model")
    assert "acc1/shift_01" not in main.columns and {"family", "params_m", "card", "paper"} <= set(main.columns)
    assert main.loc["timm/papered.in1k", "paper"] == "https://arxiv.org/abs/2110.00476"
    assert main.loc["timm/tie_a.in1k", "card"] == "https://huggingface.co/timm/tie_a.in1k"
    assert pd.isna(main.loc["timm/tie_a.in1k", "paper"])  # no paper on the Hub: no link
    # the heatmap writes its values in the cells (the tab runs only when open)
    heat = app(root, trusted_keys=f"{key_of(root)}.pub", query={"tab": "Shift heatmap"})
    spec = json.loads(next(e for e in heat.get("plotly_chart") if e.proto.id.endswith("heatmap")).proto.spec)
    assert spec["data"][0]["texttemplate"] == "%{z:.1f}" and spec["data"][0]["zmin"] == 0
    assert not [e for e in at.get("plotly_chart")]  # the default tab draws no chart


def test_downloads_are_rounded_units_and_plain_json(tmp_path):
    root = board(tmp_path / "s", models=4)
    write_model(root, model_id="timm/unsigned.in1k", architecture="vit_small", tag="in1k", num_params=22e6,
                skill=0.5, rng=np.random.default_rng(3), notes="=HYPERLINK(\"https://evil.example\")", **common(root))
    at = app(root, trusted_keys=f"{key_of(root)}.pub")
    main, community = grid(at, "main"), grid(at, "community")
    raw = download(at, "download_csv").decode()
    csv = pd.read_csv(io.StringIO(raw))
    assert list(csv["model"]) == list(main["model"]) + list(community["model"])
    assert list(csv["rank"].iloc[:len(main)]) == list(main["rank"]) and csv["rank"].iloc[len(main):].isna().all()
    assert "mean_shift_acc1 (%)" in csv.columns and "acc@1/shift_01 (%)" in csv.columns
    assert "model_mean_impact (pp)" in csv.columns and "params (M)" in csv.columns
    for col in ("mean_shift_acc1 (%)", "acc@1/shift_01 (%)", "model_mean_impact (pp)"):
        assert (csv[col].dropna() == csv[col].dropna().round(2)).all()  # no float noise
    assert csv["mean_shift_acc1 (%)"].iloc[:len(main)].tolist() == pytest.approx(
        main["mean_shift_acc1"].round(2).tolist(), abs=0.006)
    text = download(at, "download_json").decode()
    data = json.loads(text)  # valid JSON: null, not NaN
    assert "\\/" not in text and "NaN" not in text and "timm/tie_a.in1k" in text
    assert [d["model"] for d in data] == list(csv["model"]) and data[-1]["rank"] is None


def test_deep_links_restore_every_view(tmp_path):
    root = board(tmp_path / "s")
    query = {"suite": "imagenet-star", "family": ["resnet", "vit"], "params": ["10.0", "80.0"], "tab": "ID/OOD",
             "shift": "shift_02", "verified": "false", "q": "res", "columns": ["model details"]}
    at = app(root, trusted_keys=f"{key_of(root)}.pub", query=query)
    assert not at.exception
    assert at.multiselect(key="family").value == ["resnet", "vit"] and at.slider(key="params").value == (10.0, 80.0)
    assert at.selectbox(key="shift").value == "shift_02" and at.session_state["tab"] == "ID/OOD"
    assert at.text_input(key="q").value == "res" and at.multiselect(key="columns").value == ["model details"]
    assert set(grid(at, "main")["family"]) <= {"resnet"}
    drill = app(root, trusted_keys=f"{key_of(root)}.pub",
                query={"tab": "Model drilldown", "model": "timm/tie_b.in1k", "drill_config": "shift_01"})
    assert drill.selectbox(key="model").value == "timm/tie_b.in1k"
    assert drill.selectbox(key="drill_config").value == "shift_01"


def test_data_text_is_never_markdown_or_html(tmp_path):
    root = board(tmp_path / "s", models=3, extra=[("timm/noted.in1k", dict(
        architecture="resnet50", tag="a1_in1k", num_params=25e6, skill=2.0, notes=MARKDOWN))])
    bad = write_model(root, model_id="timm/bad.in1k", architecture="resnet50", tag="", num_params=1e6, skill=1.0,
                      rng=np.random.default_rng(5), **common(root))
    r = json.loads(bad.read_text())
    r["model"]["id"] = MARKDOWN  # rejected, and its reason names the id: a cell, inert
    bad.write_text(json.dumps(r))
    at = app(root, trusted_keys=f"{key_of(root)}.pub", query={"tab": "Model drilldown", "model": "timm/noted.in1k"})
    assert not at.exception
    md = [el.value for kind in ("markdown", "caption", "title", "subheader", "success", "warning", "info", "error")
          for el in at.get(kind)]
    assert md and not any("evil.example" in v or "<script>" in v for v in md)
    assert any(MARKDOWN in t for t in texts(at))  # the note, shown literally
    assert [h.proto.body for h in at.get("html")] == ["<style>[data-testid='stStatusWidget'] button {display: none}"
                                                      "</style>"]
    rejected = app(root, trusted_keys=f"{key_of(root)}.pub", query={"tab": "Rejected"})
    assert any("evil.example" in r for r in table(rejected, "reason")["reason"])  # a reason: a cell, inert


def test_reading_says_reading_n_of_m_and_nothing_about_ranks_until_read(tmp_path, monkeypatch):
    """What the page says while it reads: progress "reading N of M", and no statement about what is ranked before
    every entry is read (a cold page once said "nothing is ranked" while 3 of 4 entries were verified)."""
    import streamlit as st

    from genshift.leaderboard import store

    root = board(tmp_path / "s", models=30, rows=20)
    said = []
    real_progress, real_info, real_entry = st.progress, st.info, store.read_entry

    class Bar:
        def __init__(self, bar):
            self.bar = bar

        def progress(self, value, text=""):
            said.append(text)
            return self.bar.progress(value, text=text)

        def empty(self):
            said.append("<read>")
            return self.bar.empty()

    monkeypatch.setattr(st, "progress", lambda value, text="": said.append(text) or Bar(real_progress(value, text)))
    monkeypatch.setattr(st, "info", lambda body, **kw: said.append(body) or real_info(body, **kw))
    monkeypatch.setattr(store, "read_entry", lambda *a: said.append("entry") or real_entry(*a))
    at = app(root, trusted_keys=f"{key_of(root)}.pub")
    assert not at.exception and not at.get("progress")  # done reading: the bar is gone
    read = said.index("<read>")
    assert "reading 25 of 32 entries" in said[:read] and "reading 32 of 32 entries" in said[:read]
    assert said.count("entry") == 32 and not any("ranked" in s for s in said[:read])
    assert len(grid(at, "main")) == 32


def test_an_empty_store_a_missing_one_and_an_unreachable_hub_are_one_line(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.hubtools import free_port

    (tmp_path / "empty").mkdir()
    at = app(tmp_path / "empty")
    assert not at.exception and "No results yet" in at.info[0].value
    at = app(tmp_path / "nope")
    assert at.error[0].value == "Could not open the results store." and "does not exist" in texts(at)[0]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    at = app("org/results@" + "a" * 40)
    assert not at.exception and at.error[0].value == "Could not open the results store."
    (line,) = texts(at)
    assert "does not answer" in line and "org/results" in line and "bench download" not in line
