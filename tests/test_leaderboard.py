"""The board with real eval results (a tiny model on the toy suite): `bench verify --sign` writes the record the
board reads, `bench submit` proposes a valid store, and `bench diagnose`'s pictures in the drilldown."""

import json

import pytest

from genshift.leaderboard.store import load_store
from tests.boardkit import app, fresh_caches, grid, key_of, texts  # noqa: F401

pytestmark = pytest.mark.slow


def _eval(tmp_path, toy_suite, tiny_checkpoint):
    from genshift import evaluate

    return evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=tmp_path / "runs", workers=0,
                    compile="off", progress=False).path


def test_submit_opens_one_pull_request_and_refuses_bad_results(tmp_path, toy_suite, tiny_checkpoint, tiny_id,
                                                              tiny_folder):
    from huggingface_hub import HfApi, snapshot_download

    from genshift.errors import BenchError
    from genshift.leaderboard.submit import submit
    from tests.fakehub import FakeHub

    rpath = _eval(tmp_path, toy_suite, tiny_checkpoint)
    folder = f"toy/{tiny_folder}"
    with FakeHub() as fh:
        api = HfApi(endpoint=fh.endpoint, token="t")
        api.create_repo("org/results", repo_type="dataset")
        url = submit(rpath.parent, "org/results", endpoint=fh.endpoint, token="t")
        assert url.endswith("/discussions/1")
        files = set(api.list_repo_files("org/results", repo_type="dataset", revision="refs/pr/1"))
        assert {f"{folder}/result.json", f"{folder}/predictions/base.parquet",
                f"{folder}/predictions/shifted.parquet"} <= files
        assert f"{folder}/result.json" not in set(api.list_repo_files("org/results", repo_type="dataset"))
        # the PR's content is a valid store: a maintainer can load it as is
        snap = snapshot_download("org/results", repo_type="dataset", revision="refs/pr/1", endpoint=fh.endpoint,
                                 cache_dir=str(tmp_path / "c"))
        assert [e.model_id for e in load_store(snap).entries] == [tiny_id]  # eval records the canonical id
        result = json.loads(rpath.read_text())
        result["metrics"]["configs"]["base"]["acc1"]["value"] = 0.99
        rpath.write_text(json.dumps(result))
        with pytest.raises(BenchError, match="does not verify .*metrics.configs.base.acc1"):
            submit(rpath.parent, "org/results", endpoint=fh.endpoint, token="t")
        assert fh.repos[("dataset", "org/results")].prs == 1  # the refused submission opened nothing


def test_bench_verify_sign_writes_the_record_the_board_ranks(tmp_path, toy_suite, tiny_checkpoint, capsys):
    from genshift.cli import main
    from genshift.eval import stamps

    rpath = _eval(tmp_path, toy_suite, tiny_checkpoint)
    store, key = tmp_path / "runs", tmp_path / "maintainer.key"
    assert main(["keygen", str(key)]) == 0
    assert not load_store(str(store), trusted_keys=f"{key}.pub").entries[0].verified
    with pytest.raises(SystemExit):  # an unsigned stamp is never written (--stamp is gone)
        main(["verify", str(rpath), "--stamp"])
    assert "unrecognized arguments: --stamp" in capsys.readouterr().err
    assert main(["verify", str(rpath), "--recheck", "5", "--checkpoint", str(tiny_checkpoint), "--sign", str(key),
                 "--suite", str(toy_suite)]) == 0
    record = json.loads((rpath.parent / stamps.STAMP_FILE).read_text())["record"]
    result = json.loads(rpath.read_text())
    assert record["recheck"]["n"] == 5 and record["suite"]["trust_root"] and set(record["correct"]) == {"base",
                                                                                                          "shifted"}
    assert record["model"]["id"] == result["model"]["id"] and record["model"]["source"] == "checkpoint"
    at = app(store, trusted_keys=f"{key}.pub")
    main_table = grid(at, "main")
    assert list(main_table["model"]) == [result["model"]["id"]] and list(main_table["weights"]) == ["local weights"]
    assert main_table["rank_hi"].notna().all()  # rank intervals from the record's per-image correctness


def test_diagnose_pictures_html_and_drilldown(tmp_path, toy_suite, tiny_checkpoint, monkeypatch):
    from genshift.builders.real_models import tiny_open_clip
    from genshift.cli import main
    from genshift.eval import diagnose as diag

    rpath = _eval(tmp_path, toy_suite, tiny_checkpoint)
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
    tables = {p["config"]: read_predictions(rpath.parent / p["path"]) for p in r["predictions"]}
    r["metrics"] = score(r["suite"]["metric_family"], tables, ScoringOptions(**r["protocol"]["scoring"]))
    rpath.write_text(json.dumps(r))
    model, _, _ = tiny_open_clip()
    import open_clip
    enc = diag.ClipEncoder(model, open_clip.tokenize, 32, (0.48, 0.46, 0.41), (0.27, 0.26, 0.28), "<b>clip</b>")
    monkeypatch.setattr(diag.ClipEncoder, "from_pretrained", classmethod(lambda cls, *a, **k: enc))
    assert main(["diagnose", str(rpath.parent), "--cache-dir", str(tmp_path / "cache"), "--null", "2",
                 "--criterion", "top3"]) == 0
    rep = json.loads((rpath.parent / "diagnose.json").read_text())
    ok = [c for c in rep["classes"] if c["status"] == "ok"]
    assert ok and rep["thumbnails"] and all(i in rep["thumbnails"] for i in ok[0]["hardest"][:6])
    page = (rpath.parent / "diagnose.html").read_text()
    assert "&lt;b&gt;clip&lt;/b&gt;" in page and "<b>clip</b>" not in page  # data text escaped
    assert page.count("data:image/jpeg;base64,") >= len(ok[0]["hardest"][:6]) and "http" not in page.split("<body>")[1]
    assert "strength" in page and "permutation null" in page

    at = app(tmp_path / "runs", query={"tab": "Model drilldown"})
    assert not at.exception
    assert any("Failure directions" in s.value for s in at.subheader), ([e.value for e in at.error], texts(at))
    assert len(at.get("image")) >= 1
    assert any("strength" in t and "null p95" in t for t in texts(at))

    bad = dict(rep, thumbnails={ok[0]["hardest"][0]: "PHN2Zz48L3N2Zz4="})  # "<svg></svg>", not a raster image
    (rpath.parent / "diagnose.json").write_text(json.dumps(bad))
    from genshift.eval.diagnose_report import load_report_for_view
    view = load_report_for_view(rpath.parent)
    assert ok[0]["hardest"][0] not in view["thumbnails"]
    (rpath.parent / "diagnose.json").write_text("[" * 100000)
    assert load_report_for_view(rpath.parent) is None
