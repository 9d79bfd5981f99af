"""bench eval end to end on synthetic suites with tiny and real models; verify; resume; bad input."""

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genshift import evaluate
from genshift.cli import main
from genshift.errors import BenchError
from genshift.eval.verify import verify_result
from tests.resultkit import fake_result


def _eval(tmp_path, suite, ckpt, **kw):
    kw = {"batch_size": 16, "workers": 0, "compile": "off", "progress": False, **kw}
    r = evaluate(f"test_resnet.r160_in1k={ckpt}", str(suite), out=tmp_path / "runs", **kw)
    return dict(r.record), r.path


def test_uint8_batches_normalised_on_device_match_the_float_path(tmp_path, toy_suite, tiny_checkpoint):
    """The CUDA data path (workers ship uint8, the device normalises, as timm's prefetcher), run on CPU."""
    ref, p_ref = _eval(tmp_path / "float", toy_suite, tiny_checkpoint, normalize_on_device=False)
    dev, p_dev = _eval(tmp_path / "uint8", toy_suite, tiny_checkpoint, normalize_on_device=True)
    assert dev["run"]["normalize_on_device"] and not ref["run"]["normalize_on_device"]
    for c in ("base", "shifted"):
        a = pq.read_table(p_ref.parent / "predictions" / f"{c}.parquet")
        b = pq.read_table(p_dev.parent / "predictions" / f"{c}.parquet")
        top1 = lambda t: [r[0] for r in t["topk_idx"].to_pylist()]  # noqa: E731
        assert top1(a) == top1(b)
        assert np.allclose(a["true_prob"].to_numpy(), b["true_prob"].to_numpy(), atol=1e-4)


def test_compiled_forward_with_a_padded_last_batch_matches_eager(tmp_path, toy_suite, tiny_checkpoint):
    """torch.compile (inductor, frozen weights) at fixed shapes: 40 images in batches of 16 pad the last."""
    import torch._inductor.config as inductor

    eager, p_e = _eval(tmp_path / "eager", toy_suite, tiny_checkpoint)
    comp, p_c = _eval(tmp_path / "compiled", toy_suite, tiny_checkpoint, compile="on")
    assert comp["run"]["compile"] == "on" and not inductor.freezing  # frozen for this model only
    for c in ("base", "shifted"):
        a = pq.read_table(p_e.parent / "predictions" / f"{c}.parquet")
        b = pq.read_table(p_c.parent / "predictions" / f"{c}.parquet")
        assert a.num_rows == b.num_rows == 40 and a["image_id"].to_pylist() == b["image_id"].to_pylist()
        assert [r[0] for r in a["topk_idx"].to_pylist()] == [r[0] for r in b["topk_idx"].to_pylist()]
        assert np.allclose(a["true_prob"].to_numpy(), b["true_prob"].to_numpy(), atol=1e-4)


def test_eval_writes_predictions_metrics_and_provenance(tmp_path, toy_suite, tiny_checkpoint):
    result, path = _eval(tmp_path, toy_suite, tiny_checkpoint)
    assert path.name == "result.json" and result["schema_version"] == 2
    assert result["model"]["source"] == "checkpoint" and len(result["model"]["weights_sha256"]) == 64
    assert result["data_config"]["input_size"] == [3, 160, 160]  # timm's test-size config of the model
    assert result["suite"]["manifest_sha256"] and result["suite"]["configs"] == ["base", "shifted"]
    preds = pq.read_table(path.parent / "predictions" / "base.parquet")
    assert preds.num_rows == 40 and preds["image_id"].to_pylist() == sorted(preds["image_id"].to_pylist())
    assert preds.schema.field("topk_idx").type.list_size == 10
    probs = np.stack(preds["topk_prob"].to_numpy(zero_copy_only=False))
    assert (np.diff(probs, axis=1) <= 0).all()  # sorted, most probable first
    rank0 = preds["true_rank"].to_numpy() == 0
    top1 = np.stack(preds["topk_idx"].to_numpy(zero_copy_only=False))[:, 0] == preds["label"].to_numpy()
    assert np.array_equal(rank0, top1)
    kept = result["counts"]["base"]["kept"]
    assert result["metrics"]["configs"]["base"]["n_scored"] == kept
    acc = top1[preds["keep"].to_numpy(zero_copy_only=False)].mean()
    assert result["metrics"]["configs"]["base"]["acc1"]["value"] == pytest.approx(acc)
    assert verify_result(path, suite=str(toy_suite)).ok


def test_rerun_is_a_noop_and_other_settings_are_refused(tmp_path, toy_suite, tiny_checkpoint):
    _, path = _eval(tmp_path, toy_suite, tiny_checkpoint)
    mtime = path.stat().st_mtime_ns
    _eval(tmp_path, toy_suite, tiny_checkpoint)
    assert path.stat().st_mtime_ns == mtime
    with pytest.raises(BenchError, match="other settings; re-run with force=True"):
        _eval(tmp_path, toy_suite, tiny_checkpoint, limit_per_class=1)


def test_limit_per_class_takes_first_ids(tmp_path, toy_suite, tiny_checkpoint):
    result, path = _eval(tmp_path, toy_suite, tiny_checkpoint, limit_per_class=2)
    ids = pq.read_table(path.parent / "predictions" / "shifted.parquet")["image_id"].to_pylist()
    assert ids == sorted(f"shifted/{c:03d}/{i:02d}" for c in range(10) for i in range(2))
    assert result["flags"]["partial"]


def test_verify_catches_tampered_predictions_and_metrics(tmp_path, toy_suite, tiny_checkpoint, capsys):
    _, path = _eval(tmp_path, toy_suite, tiny_checkpoint)
    result = json.loads(path.read_text())
    result["metrics"]["configs"]["shifted"]["acc1"]["value"] += 0.01
    path.write_text(json.dumps(result))
    rep = verify_result(path, suite=str(toy_suite))
    assert not rep.ok and any("metrics.configs.shifted.acc1.value" in p for p in rep.problems)
    # a predictions file edited and its hash "fixed" in the result is still caught by the recomputation
    _, path2 = _eval(tmp_path / "b", toy_suite, tiny_checkpoint)
    pfile = path2.parent / "predictions" / "base.parquet"
    t = pq.read_table(pfile)
    import pyarrow as pa
    t = t.set_column(t.schema.get_field_index("true_rank"), "true_rank", pa.array(np.zeros(t.num_rows, np.int32)))
    pq.write_table(t, pfile)
    assert main(["verify", str(path2)]) == 1
    assert "predictions/base.parquet sha256" in capsys.readouterr().out
    from genshift.fsutil import sha256_file
    r2 = json.loads(path2.read_text())
    r2["predictions"][0]["sha256"] = sha256_file(pfile)
    path2.write_text(json.dumps(r2))
    rep = verify_result(path2, suite=str(toy_suite))  # each row's true_rank no longer agrees with its stored top-k
    assert not rep.ok and any("base.parquet" in p and "true_rank" in p for p in rep.problems)


def test_verify_recheck_reruns_images(tmp_path, toy_suite, tiny_checkpoint):
    _, path = _eval(tmp_path, toy_suite, tiny_checkpoint)
    assert verify_result(path, recheck=6, checkpoint=str(tiny_checkpoint), suite=str(toy_suite)).ok
    t = pq.read_table(path.parent / "predictions" / "base.parquet")
    import pyarrow as pa
    probs = t["true_prob"].to_numpy().copy()
    probs[:] = 0.5
    t = t.set_column(t.schema.get_field_index("true_prob"), "true_prob", pa.array(probs))
    pq.write_table(t, path.parent / "predictions" / "base.parquet")
    r = json.loads(path.read_text())
    from genshift.eval.predictions import read_predictions
    from genshift.eval.scoring import ScoringOptions, score
    from genshift.fsutil import sha256_file
    r["predictions"][0]["sha256"] = sha256_file(path.parent / "predictions" / "base.parquet")
    tables = {p["config"]: read_predictions(path.parent / p["path"]) for p in r["predictions"]}
    r["metrics"] = score("accuracy", tables, ScoringOptions(**r["protocol"]["scoring"]))
    path.write_text(json.dumps(r))
    rep = verify_result(path, recheck=40, checkpoint=str(tiny_checkpoint), suite=str(toy_suite))
    # caught before any re-run: true_prob no longer agrees with the row's own top-k (re-runs: test_results_trust.py)
    assert not rep.ok and any("true_prob" in p for p in rep.problems)


def test_resume_after_kill_gives_identical_predictions(tmp_path, tiny_checkpoint, tiny_folder, monkeypatch):
    from genshift.eval import merging as P
    from genshift.synthetic import make_synthetic_suite

    toy_suite = tmp_path / "toy"
    make_synthetic_suite(toy_suite, classes=range(10), per_class=4)

    _, ref = _eval(tmp_path / "ref", toy_suite, tiny_checkpoint, batch_size=5, unit_rows=5)
    calls = {"n": 0}
    orig_add = P.CheckpointedPredictions.add

    def flaky_add(self, unit, block, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # killed after two flushed units
        orig_add(self, unit, block, **kw)

    monkeypatch.setattr(P.CheckpointedPredictions, "__init__", _small_flush(P.CheckpointedPredictions.__init__))
    monkeypatch.setattr(P.CheckpointedPredictions, "add", flaky_add)
    with pytest.raises(KeyboardInterrupt):
        _eval(tmp_path / "run", toy_suite, tiny_checkpoint, batch_size=5, unit_rows=5)
    work = tmp_path / "run" / "runs" / "toy" / tiny_folder / ".work" / "base"
    assert len(list(work.glob("part-*.parquet"))) == 2
    monkeypatch.setattr(P.CheckpointedPredictions, "add", orig_add)
    result, path = _eval(tmp_path / "run", toy_suite, tiny_checkpoint, batch_size=5, unit_rows=5)
    assert result["run"]["timings"]["base"]["resumed_units"] == 2
    assert result["run"]["timings"]["shifted"]["resumed_units"] == 0
    for cfg in ("base", "shifted"):
        a = pq.read_table(ref.parent / "predictions" / f"{cfg}.parquet")
        b = pq.read_table(path.parent / "predictions" / f"{cfg}.parquet")
        assert a.equals(b)


def _small_flush(init):
    def wrapped(self, *a, **kw):
        kw["flush_rows"] = 1
        init(self, *a, **kw)
    return wrapped


@pytest.mark.slow
def test_real_efficientnet_lite0_recognises_real_photos(tmp_path, lite0_weights):
    """Real ImageNet weights on scikit-image's photos: tabby cat and espresso in the top-5."""
    from PIL import Image
    from skimage import data

    from genshift.suite_format import SuiteWriter

    def jpeg(arr):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=95)
        return buf.getvalue()

    rows = [("chelsea", 281, data.chelsea()), ("coffee", 967, data.coffee())]  # tabby cat, espresso
    with SuiteWriter(tmp_path / "photos", suite_id="photos") as w:
        w.write_shard("real", 0, 1, ({"image": {"bytes": jpeg(a), "path": None}, "label": y, "image_id": f"real/{n}",
                                      "config": "real", "keep": True, "pair_id": None} for n, y, a in rows))
        w.finalize(generator={})
    code = main(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", lite0_weights, "--remap-by-order",
                 "--suite", str(tmp_path / "photos"), "--out", str(tmp_path / "runs"), "--workers", "0",
                 "--no-progress", "--compile", "off"])
    assert code == 0
    # local weights: the id is the architecture and its tensors' digest (genshift.identity), not timm's default tag
    (run,) = (tmp_path / "runs/photos").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["model"]["id"] == f"tf_efficientnet_lite0@sha256:{result['model']['tensors_sha256'][:16]}"
    assert run.name == result["model"]["id"].replace(":", "-") and result["model"]["tag"] is None
    assert result["metrics"]["configs"]["real"]["acc5"]["value"] == 1.0
    t = pq.read_table(run / "predictions/real.parquet")
    top = dict(zip(t["image_id"].to_pylist(), t["topk_idx"].to_pylist()))
    assert top["real/coffee"][0] == 967  # espresso is top-1
    assert 281 in top["real/chelsea"][:5] and set(top["real/chelsea"][:3]) <= {281, 282, 285, 287, 283}


def test_bad_image_fails_naming_it_or_is_skipped(tmp_path, tiny_checkpoint):
    from genshift.suite_format import SuiteWriter

    good = io.BytesIO()
    from PIL import Image
    Image.new("RGB", (32, 32), (200, 10, 10)).save(good, format="JPEG")
    with SuiteWriter(tmp_path / "s", suite_id="bad") as w:
        rows = [{"image": {"bytes": good.getvalue(), "path": None}, "label": 1, "image_id": "c/ok", "config": "c",
                 "keep": True, "pair_id": None},
                {"image": {"bytes": b"\xff\xd8 not a jpeg", "path": None}, "label": 1, "image_id": "c/broken",
                 "config": "c", "keep": True, "pair_id": None}]
        w.write_shard("c", 0, 1, rows)
        w.finalize(generator={})
    with pytest.raises(BenchError, match="image 'c/broken' of config 'c' does not decode"):
        _eval(tmp_path, tmp_path / "s", tiny_checkpoint)
    result, _ = _eval(tmp_path / "skip", tmp_path / "s", tiny_checkpoint, skip_bad_images=True)
    assert result["counts"]["c"]["skipped_bad"] == 1 and result["counts"]["c"]["skipped_bad_ids"] == ["c/broken"]
    assert result["metrics"]["configs"]["c"]["n_scored"] == 1 and result["flags"]["skipped_bad_images"]


@pytest.mark.parametrize("argv, match", [
    (["--model", "resnet5O"], "unknown timm model 'resnet5O'. Did you mean"),
    (["--model", "vit_base_patch16_224.augreg_in21k", "--checkpoint", "CKPT"], "does not fit"),
    (["--configs", "base,shiftd"], "unknown config 'shiftd'. Did you mean 'shifted'"),
    (["--device", "cuda"], "CUDA is not available"),
    (["--device", "tpu"], "--device must be"),
    (["--topk", "3"], "--topk must be in 5..1000, got 3"),
    (["--topk", "1001"], "--topk must be in 5..1000, got 1001"),
    (["--bootstrap", "1e12"], "--bootstrap must be in 1..100000"),
    (["--batch-size", "0"], "--batch-size must be in 1..65536, got 0"),
    (["--max-resident", "0"], "--max-resident must be in 1..1024, got 0"),
    (["--limit-per-class", "x"], "--limit-per-class must be a whole number"),
    (["--checkpoint", "/nonexistent.pth"], "does not exist"),
])
def test_bad_eval_input(tmp_path, toy_suite, tiny_checkpoint, capsys, argv, match):
    args = {"--model": "test_resnet.r160_in1k", "--checkpoint": str(tiny_checkpoint), "--suite": str(toy_suite),
            "--out": str(tmp_path / "runs")}
    it = iter(argv)
    for k in it:
        v = next(it)
        args[k] = str(tiny_checkpoint) if v == "CKPT" else v
    code = main(["eval", *[x for kv in args.items() for x in kv], "--no-progress", "--workers", "0"])
    err = capsys.readouterr().err
    assert code != 0 and match in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs" / "toy").exists() or not list((tmp_path / "runs").rglob("result.json"))


def test_model_typo_is_reported_before_the_suite_is_resolved(tmp_path, monkeypatch, capsys):
    # offline, a registry suite cannot resolve; the model typo must still be the error the user sees
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["eval", "--model", "resnet5O", "--suite", "imagenet-star", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "unknown timm model 'resnet5O'" in err and "imagenet-star" not in err


def test_non_1000_class_model_is_refused(tmp_path):
    import timm
    import torch

    from genshift.eval.models import load_classifier
    m = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    torch.save(m.state_dict(), tmp_path / "ten.pth")
    with pytest.raises(BenchError, match="not fit"):
        load_classifier("test_resnet.r160_in1k", checkpoint=tmp_path / "ten.pth")
    with pytest.raises(BenchError, match="has 21843 output classes, not the 1000"):
        load_classifier("vit_base_patch16_224.augreg_in21k", pretrained=False)


def test_suite_failing_verification_and_missing_suite(tmp_path, toy_suite, tiny_checkpoint):
    from genshift.errors import IntegrityError
    p = toy_suite / "data/base/test-00000-of-00002.parquet"
    p.write_bytes(p.read_bytes()[:-1] + b"x")
    with pytest.raises(IntegrityError, match="test-00000-of-00002.parquet sha256"):
        _eval(tmp_path, toy_suite, tiny_checkpoint)


def test_output_dir_not_writable(tmp_path, toy_suite, tiny_checkpoint):
    import os
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")  # a file where the output folder should go: unwritable even for root
        out = blocker / "runs"
    else:
        out = tmp_path / "ro"
        out.mkdir(mode=0o500)
    with pytest.raises(BenchError, match="is not writable"):
        evaluate(f"test_resnet.r160_in1k={tiny_checkpoint}", str(toy_suite), out=out, workers=0, progress=False)


@pytest.mark.parametrize("content, match", [
    ("{", "not valid JSON"),
    (json.dumps({"kind": "genshift-result", "schema_version": 7}), "schema_version 7 is not supported"),
    (json.dumps({"kind": "other"}), "not a genshift-bench result"),
    (json.dumps({"kind": "genshift-result", "schema_version": 2}), "field 'model' is missing"),
])
def test_malformed_result_files(tmp_path, capsys, content, match):
    p = tmp_path / "result.json"
    p.write_text(content)
    assert main(["verify", str(p)]) != 0
    assert match in capsys.readouterr().err


def test_slope_cli_over_results(tmp_path, capsys):
    def fake(model, base, snow):  # schema-valid (genshift.eval.results.validate), numbers made up
        return fake_result(model, ["base", "snow"],
                           {"configs": {"base": {"acc1": {"value": base}}, "snow": {"acc1": {"value": snow}}}})

    paths = []
    for i, (b, s) in enumerate([(0.6, 0.5), (0.7, 0.55), (0.8, 0.6)]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(fake(f"m{i}", b, s)))
        paths.append(str(p))
    assert main(["slope", *paths, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shifts"]["snow"]["linear"]["slope"] == pytest.approx(0.5)
    assert out["shifts"]["snow"]["linear"]["r2"] == pytest.approx(1.0)
    assert main(["slope", paths[0]]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_odd_images_in_a_suite_from_elsewhere_are_read_as_import_stores_them(tmp_path, lite0_weights, decode):
    """A suite not made by import-folder may hold a raw 16-bit PNG or a transparent RGBA PNG. Eval reads
    every image through genshift.pixels (16 bits scaled, transparency on white), as import stores
    them: the 16-bit photo scores as its 8-bit original (PIL's convert('RGB') made it all white,
    the true class ranked ~200th), on the default decode path and on --decode device's CPU path."""
    from PIL import Image
    from skimage import data

    from genshift.suite_format import SuiteWriter

    def png(im):
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        return buf.getvalue()

    gray = np.asarray(Image.fromarray(data.coffee()).convert("L"))
    rgba = np.dstack([data.coffee(), np.full(gray.shape, 255, np.uint8)])
    images = {"eight": png(Image.fromarray(gray)), "sixteen": png(Image.fromarray(gray.astype(np.uint16) * 257)),
              "rgba": png(Image.fromarray(rgba, "RGBA")), "rgb": png(Image.fromarray(data.coffee()))}
    assert Image.open(io.BytesIO(images["sixteen"])).mode == "I;16"
    with SuiteWriter(tmp_path / "odd", suite_id="odd") as w:
        w.write_shard("real", 0, 1, ({"image": {"bytes": b, "path": None}, "label": 967, "image_id": f"real/{n}",
                                      "config": "real", "keep": True, "pair_id": None} for n, b in images.items()))
        w.finalize(generator={})
    code = main(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", lite0_weights, "--remap-by-order",
                 "--suite", str(tmp_path / "odd"), "--out", str(tmp_path / "runs"), "--workers", "0",
                 "--no-progress", "--compile", "off", "--decode", decode])
    assert code == 0
    (path,) = (tmp_path / "runs").rglob("real.parquet")
    t = pq.read_table(path)
    row = {i: (k, p, r) for i, k, p, r in zip(t["image_id"].to_pylist(), t["topk_idx"].to_pylist(),
                                               t["true_prob"].to_pylist(), t["true_rank"].to_pylist())}
    assert row["real/sixteen"][0] == row["real/eight"][0]
    assert row["real/sixteen"][1] == pytest.approx(row["real/eight"][1], abs=1e-3)
    assert row["real/rgba"][0] == row["real/rgb"][0] and row["real/rgb"][2] == 0  # opaque alpha: the RGB photo


@pytest.fixture(scope="module")
def near_tie_checkpoint(tmp_path_factory):
    """test_resnet whose head makes the toy suite's ten classes (0..9) the most probable, apart by
    tiny amounts: fp32 tells them apart, bf16 (8-bit mantissa) ties many of them."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_resnet.r160_in1k", pretrained=False)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    w, b = sd["fc.weight"].clone(), sd["fc.bias"].clone()
    g = torch.Generator().manual_seed(1)
    w[:10] = w[0] + 1e-3 * torch.randn(10, w.shape[1], generator=g)
    b[:10] = 8.0 + 2e-3 * torch.randn(10, generator=g)
    sd["fc.weight"], sd["fc.bias"] = w, b
    path = tmp_path_factory.mktemp("ties") / "near_tie.safetensors"
    save_file(sd, str(path))
    return path


def _rows(path, config):
    t = pq.read_table(path.parent / "predictions" / f"{config}.parquet")
    top = np.array(t["topk_idx"].to_pylist())
    probs = np.array(t["topk_prob"].to_pylist())
    return t, top, probs, t["label"].to_numpy(), t["true_rank"].to_numpy(), t["true_prob"].to_numpy()


def test_ties_rank_like_the_topk_in_fp32_and_bf16(tmp_path, toy_suite, near_tie_checkpoint):
    """bf16 autocast on CPU (the --amp path) ties classes; true_rank must break ties as the stored top-k does
    (by class index, never in the true class's favour), so acc@1 moves only where top-1 really moved."""
    from genshift.eval.verify import check_rows

    fp32, p32 = _eval(tmp_path / "fp32", toy_suite, near_tie_checkpoint)
    bf16, p16 = _eval(tmp_path / "bf16", toy_suite, near_tie_checkpoint, amp=True, amp_dtype="bfloat16")
    assert bf16["run"]["amp"] and bf16["run"]["amp_dtype"] == "bfloat16" and bf16["run"]["device"] == "cpu"
    ties_at_label = 0
    for c in ("base", "shifted"):
        t32, top32, _, y, r32, _ = _rows(p32, c)
        t16, top16, pr16, y16, r16, tp16 = _rows(p16, c)
        assert (y == y16).all()
        for top, r in ((top32, r32), (top16, r16)):
            assert ((r == 0) == (top[:, 0] == y)).all()  # rank and top-k agree on every row
            assert ((r < 3) == (top[:, :3] == y[:, None]).any(axis=1)).all()  # top-3 failure == from the top-k
            hit = top == y[:, None]
            assert (r[hit.any(axis=1)] == hit.argmax(axis=1)[hit.any(axis=1)]).all()
        # the bf16 run really tied the true class with another top-k class (the case the old rule miscounted)
        ties_at_label += int(((pr16 == tp16[:, None]).sum(axis=1) > 1).sum())
        changed = int((top32[:, 0] != top16[:, 0]).sum())
        acc32 = fp32["metrics"]["configs"][c]["acc1"]["value"]
        acc16 = bf16["metrics"]["configs"][c]["acc1"]["value"]
        n = fp32["metrics"]["configs"][c]["n_scored"]
        assert abs(acc16 - acc32) * n <= changed + 1e-9
        assert check_rows(t16, topk=10, where=c) == [] and check_rows(t32, topk=10, where=c) == []
    assert ties_at_label > 0
    # verify catches a row whose rank counts a tie in the true class's favour
    t16, top16, _, y16, r16, _ = _rows(p16, "base")
    i = int(np.flatnonzero(top16[:, 0] != y16)[0])
    bad = t16.set_column(t16.schema.get_field_index("true_rank"), "true_rank",
                         pa.array(np.where(np.arange(len(r16)) == i, 0, r16).astype(np.int32)))
    problems = check_rows(bad, topk=10, where="base")
    assert len(problems) == 1 and "true_rank different from the label's position in the top-k" in problems[0]


def test_rank_classes_hand_computed_ties():
    """rank = #{p > p_y} + #{c < y : p_c = p_y}; the top-k lists tied classes by index."""
    import torch

    from genshift.eval.inference import rank_classes

    probs = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25, 0.0]])
    top_i, top_p, true_p, rank = rank_classes(probs, torch.tensor([2, 0]), 3)
    assert top_i.tolist() == [[1, 2, 3], [0, 1, 2]]
    assert rank.tolist() == [1, 0] and true_p.tolist() == pytest.approx([0.3, 0.25])
    _, _, _, rank = rank_classes(probs, torch.tensor([4, 3]), 3)
    assert rank.tolist() == [4, 3]  # class 4 ties class 0 at 0.1 and comes after it; class 3 after 0, 1, 2


def test_verify_recheck_counts_a_stored_image_that_does_not_decode_in_one_line(tmp_path, toy_suite, tiny_checkpoint,
                                                                              monkeypatch):
    """An image whose header claims sides over the bounds (a forged suite a result points at) is counted as a
    disagreeing row, checked from the header before any decode, never named; the other drawn images still match."""
    import struct
    import zlib

    from genshift.eval import verify

    _, path = _eval(tmp_path, toy_suite, tiny_checkpoint)
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 12_000, 8_000, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    real = verify._stream_images
    forged = []

    def one_forged(suite, config, ids):
        for iid, data in real(suite, config, ids):
            if not forged:
                forged.append(iid)
                data = png
            yield iid, data

    monkeypatch.setattr(verify, "_stream_images", one_forged)
    rep = verify_result(path, recheck=6, checkpoint=str(tiny_checkpoint), suite=str(toy_suite))
    assert not rep.ok and forged and rep.recheck["disagreeing"] == 1
    assert rep.problems == ["1 of the 6 re-run rows disagree with the stored predictions (1 a stored prediction for "
                            "an image that does not decode)"]
