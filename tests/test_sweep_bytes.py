"""Sweeps write every model's files byte for byte as a single evaluation does: one decode per
preprocessing group, a failing model recorded while the others finish, identities, one read per file.
Shared fixtures: tests/sweepkit.py."""

import json
import os
import shutil
from pathlib import Path

import pytest

from genshift import evaluate
from genshift.cli import main
from genshift.errors import BenchError, IntegrityError
from genshift.eval.options import EvalOptions, ModelSpec, resolve_models
from genshift.eval.sweep import SweepRequest, run_sweep
from tests.sweepkit import ARCHS, CLI_OPTS, FOLDER, OPTS, files, sweep


def test_sweep_equals_single_runs_byte_for_byte(tmp_path, suite, zoo, singles):
    jobs = sweep(tmp_path, suite, zoo, max_resident=1)  # chunks of one model: the bound is honoured
    assert [j.status for j in jobs] == ["done"] * 3
    ref = files(singles)
    assert len(ref) == 6 and files(tmp_path) == ref
    for a in ARCHS:
        r = json.loads((tmp_path / "toy" / FOLDER[a] / "result.json").read_text())
        s = json.loads((singles / "toy" / FOLDER[a] / "result.json").read_text())
        assert r["config_hash"] == s["config_hash"] and r["metrics"] == s["metrics"]
        assert r["run"]["effective_batch_size"] == 4
        assert not (tmp_path / "toy" / FOLDER[a] / ".work").exists()


def test_a_finished_run_is_found_without_opening_the_suite_or_loading_a_model(tmp_path, suite, zoo, capsys,
                                                                               monkeypatch):
    """A rerun of the same request, whatever the grouping, answers from the results on disk: no suite
    opened, no model loaded, no progress bar; another setting that changes the numbers is refused."""
    from genshift.eval import sweep as module

    argv = ["eval", "--model", f"{ARCHS[2]}={zoo[ARCHS[2]]}", "--suite", str(suite), "--out", str(tmp_path), *CLI_OPTS]
    assert main(argv) == 0
    result = tmp_path / "toy" / FOLDER[ARCHS[2]] / "result.json"
    mtime = result.stat().st_mtime_ns
    capsys.readouterr()

    def untouchable(*a, **kw):
        raise AssertionError("a finished run was opened again")

    monkeypatch.setattr(module, "open_suite", untouchable)
    monkeypatch.setattr(module, "load_model", untouchable)
    assert main([*argv[:-1]]) == 0  # with the progress bar on: none is drawn
    out = capsys.readouterr()
    assert "\r" not in out.err and f"result: {result}" in out.out
    assert result.stat().st_mtime_ns == mtime
    jobs = sweep(tmp_path, suite, zoo, archs=ARCHS[2:], max_resident=1, unit_rows=200)  # the CLI's default units
    assert jobs[0].status == "done" and jobs[0].result == json.loads(result.read_text())
    monkeypatch.undo()
    with pytest.raises(BenchError, match="other settings; re-run with force=True"):
        sweep(tmp_path, suite, zoo, archs=ARCHS[2:], topk=5, unit_rows=200)


def test_models_alive_never_exceed_max_resident(tmp_path, suite, zoo, singles, monkeypatch):
    """max_resident=1 over three models: one model alive at each forward, the files a single run's."""
    import gc
    import weakref

    from genshift.eval import sweep as module

    alive, peak = set(), [0]
    orig_load, orig_predict = module.load_model, module.predict_units

    def load(opts, spec):
        clf = orig_load(opts, spec)
        alive.add(id(clf.model))
        weakref.finalize(clf.model, alive.discard, id(clf.model))
        return clf

    def predict(*a, **kw):
        gc.collect()  # a model dropped by the sweep is gone, not merely unreferenced
        peak[0] = max(peak[0], len(alive))
        return orig_predict(*a, **kw)

    monkeypatch.setattr(module, "load_model", load)
    monkeypatch.setattr(module, "predict_units", predict)
    sweep(tmp_path, suite, zoo, max_resident=1)
    assert peak[0] == 1 and files(tmp_path) == files(singles)


def test_one_decode_feeds_every_model_of_a_group(tmp_path, suite, zoo, monkeypatch):
    from genshift.eval import inference

    seen = []
    orig = inference.UnitDataset.__getitem__
    monkeypatch.setattr(inference.UnitDataset, "__getitem__", lambda self, i: seen.append(i) or orig(self, i))
    sweep(tmp_path, suite, zoo)
    # 2 configs x 5 units of <= 4 rows, decoded once per group (2 groups) -> 20, not 30
    assert len(seen) == 20


def test_models_of_a_group_normalise_with_their_own_mean_and_std(tmp_path, suite, zoo):
    """A device-normalised group shares the uint8 decode, never the mean/std: each model's bytes are its own run's."""
    specs = (ModelSpec(ARCHS[0], str(zoo[ARCHS[0]])),
             ModelSpec(ARCHS[1], str(zoo[ARCHS[1]]), data_config={"mean": (0.485, 0.456, 0.406),
                                                                   "std": (0.229, 0.224, 0.225)}))
    opts = EvalOptions(**OPTS, normalize_on_device=True)
    for i, spec in enumerate(specs):
        run_sweep(SweepRequest(models=(spec,), suite=str(suite), out=str(tmp_path / f"alone{i}"), options=opts))
    jobs = run_sweep(SweepRequest(models=specs, suite=str(suite), out=str(tmp_path / "both"), options=opts))
    assert len({j.state["group"] for j in jobs}) == 1  # one decode for both
    assert files(tmp_path / "both") == {**files(tmp_path / "alone0"), **files(tmp_path / "alone1")}


def test_failing_model_leaves_the_others_intact(tmp_path, suite, zoo, singles, monkeypatch, capsys):
    from genshift.eval import inference

    orig = inference.Forward.__call__
    calls = {"n": 0}

    def broken(self, x, labels):
        if type(self.model).__name__ == "VisionTransformer":
            calls["n"] += 1
            if calls["n"] == 3:  # fails mid-sweep, after some of its units were written
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return orig(self, x, labels)

    monkeypatch.setattr(inference.Forward, "__call__", broken)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not weights")
    models = tmp_path / "zoo.txt"
    models.write_text("".join(f"{a} {zoo[a]}\n" for a in ARCHS) + f"test_efficientnet.r160_in1k {bad}\n")
    code = main(["eval", "--models", str(models), "--suite", str(suite), "--out", str(tmp_path), *CLI_OPTS])
    out = capsys.readouterr().out
    vit = FOLDER[ARCHS[1]]  # loaded, then failed: under its canonical id's folder
    assert code == 1 and f"2 model(s) failed: {vit.replace('sha256-', 'sha256:')}, test_efficientnet.r160_in1k" in out
    ref = files(singles)
    got = files(tmp_path)
    assert {k: v for k, v in ref.items() if "test_vit" not in k} == got
    fail = json.loads((tmp_path / "toy" / vit / "failure.json").read_text())
    assert "illegal memory access" in fail["error"]
    # the rerun retries the failed model only, resuming its written units
    monkeypatch.setattr(inference.Forward, "__call__", orig)
    models.write_text("".join(f"{a} {zoo[a]}\n" for a in ARCHS))
    assert main(["eval", "--models", str(models), "--suite", str(suite), "--out", str(tmp_path), *CLI_OPTS]) == 0
    assert files(tmp_path) == ref
    assert not (tmp_path / "toy" / vit / "failure.json").exists()


def test_wildcards_and_model_lists(tmp_path, suite):
    specs, exp = resolve_models(["timm/test_vit*", "test_resnet.r160_in1k"])
    assert exp == {"timm/test_vit*": ["timm/test_vit.r160_in1k", "timm/test_vit2.r160_in1k",
                                      "timm/test_vit3.r160_in1k"]}
    assert [s.name for s in specs][-1] == "test_resnet.r160_in1k" and specs[0].from_wildcard == "timm/test_vit*"
    # the 21k-class head is dropped from an expansion, and a pattern of only such heads is refused
    _, exp = resolve_models(["vit_base_patch16_224.augreg_in21k*"])
    assert exp == {"vit_base_patch16_224.augreg_in21k*": ["vit_base_patch16_224.augreg_in21k_ft_in1k"]}
    with pytest.raises(BenchError, match="matches 5 model.*but none has a 1000-class ImageNet head"):
        resolve_models(["convnext_*.fb_in22k"])
    # the expansion is recorded with the run (the protocol and config hash stay a single eval's)
    specs, exp = resolve_models(["test_vit3*"])
    jobs = run_sweep(SweepRequest(models=tuple(specs), suite=str(suite), out=str(tmp_path), wildcards=exp,
                                  options=EvalOptions(**OPTS, pretrained=False)))
    r = jobs[0].result
    assert r["run"]["wildcard"] == {"pattern": "test_vit3*", "expansion": ["test_vit3.r160_in1k"]}
    assert "wildcard" not in json.dumps(r["protocol"])


def test_config_names_cannot_reach_outside_out(tmp_path, suite, zoo, monkeypatch):
    from genshift.eval.merging import CheckpointedPredictions
    from genshift.eval.predictions import schema

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    work = tmp_path / "runs" / "toy" / "m" / ".work"
    for name in ("../../../../victim", "..", "/etc", "a/b"):
        with pytest.raises(IntegrityError, match="cannot be used as a file or folder name"):
            CheckpointedPredictions(work, name, schema())
    from genshift.eval import sweep as module

    real_open = module.open_suite

    def hostile_open(*a, **kw):  # a verified suite whose manifest then names a config '../../../victim'
        info = real_open(*a, **kw)
        cfgs = info.suite.manifest.configs
        cfgs["../../../victim"] = cfgs.pop("base")
        return info

    monkeypatch.setattr(module, "open_suite", hostile_open)
    with pytest.raises(IntegrityError, match="cannot be used as a file or folder name"):
        sweep(tmp_path / "runs", suite, zoo, archs=ARCHS[:1])
    assert (victim / "keep.txt").read_text() == "precious"
    # the containment check itself, for a path that escapes through a symlink
    (work).mkdir(parents=True, exist_ok=True)
    (work / "link").symlink_to(victim)
    ck = CheckpointedPredictions.__new__(CheckpointedPredictions)
    ck.work_dir, ck.dir, ck.schema, ck._pending = work, work / "link", schema(), []
    with pytest.raises(IntegrityError, match="not inside"):
        ck.finish(tmp_path / "runs" / "x.parquet")
    assert (victim / "keep.txt").read_text() == "precious"


@pytest.mark.slow
def test_decode_device_cpu_path_agrees_and_is_recorded(tmp_path, lite0_weights):
    """--decode device (torchvision.io.decode_jpeg + tensor resize/crop) on CPU: real photos get the
    default path's top-1, a PNG is decoded too, a broken JPEG is named and skipped; the protocol says so."""
    import io

    import numpy as np
    import pyarrow.parquet as pq
    from PIL import Image
    from skimage import data

    from genshift.suite_format import SuiteWriter

    def enc(arr, fmt):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        return buf.getvalue()

    rows = [("chelsea", 281, enc(data.chelsea(), "JPEG")), ("coffee", 967, enc(data.coffee(), "JPEG")),
            ("astronaut", 0, enc(data.astronaut(), "PNG")), ("rocket", 0, enc(data.rocket(), "JPEG")),
            ("broken", 1, b"\xff\xd8\xff\xe0 truncated")]
    with SuiteWriter(tmp_path / "photos", suite_id="photos") as w:
        w.write_shard("real", 0, 1, ({"image": {"bytes": b, "path": None}, "label": y, "image_id": f"real/{n}",
                                      "config": "real", "keep": True, "pair_id": None} for n, y, b in rows))
        w.finalize(generator={})
    res = {}
    for mode in ("cpu", "device"):
        r = evaluate(f"tf_efficientnet_lite0={lite0_weights}", str(tmp_path / "photos"), out=tmp_path / mode,
                     remap_by_order=True, workers=0, compile="off", decode=mode, skip_bad_images=True, progress=False)
        res[mode], path = r.record, r.path
        res[mode + "_t"] = pq.read_table(path.parent / "predictions" / "real.parquet")
    assert "decode" not in res["cpu"]["protocol"] and res["device"]["protocol"]["decode"] == "device"
    assert res["cpu"]["config_hash"] != res["device"]["config_hash"]
    assert res["device"]["counts"]["real"]["skipped_bad_ids"] == ["real/broken"]
    a, b = res["cpu_t"], res["device_t"]
    assert a["image_id"].to_pylist() == b["image_id"].to_pylist() == ["real/astronaut", "real/chelsea",
                                                                        "real/coffee", "real/rocket"]
    top_a = np.array(a["topk_idx"].to_pylist())[:, 0]
    top_b = np.array(b["topk_idx"].to_pylist())[:, 0]
    assert (top_a == top_b).all()
    assert np.abs(a["true_prob"].to_numpy() - b["true_prob"].to_numpy()).max() < 0.05


def test_effective_batch_size_after_oom_backoff_is_recorded(tmp_path, suite, zoo, monkeypatch):
    from genshift.eval import inference

    orig = inference.Forward.__call__

    def small_memory(self, x, labels):
        if x.shape[0] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return orig(self, x, labels)

    monkeypatch.setattr(inference.Forward, "__call__", small_memory)
    jobs = sweep(tmp_path, suite, zoo, archs=ARCHS[2:])
    r = jobs[0].result
    assert r["run"]["batch_size"] == 4 and r["run"]["effective_batch_size"] == 2
    assert r["run"]["timings"]["base"]["effective_batch_size"] == 2


def test_local_weights_get_their_own_identity(tmp_path, suite, zoo, capsys):
    """A checkpoint's id is its architecture + its tensors' digest (genshift.identity), never the name given with
    it (kept as declared_name) nor the registry's default tag; the same weights under two names are scored once."""
    import hashlib

    import timm
    import torch
    from safetensors.torch import save_file

    a = ARCHS[2]
    other = tmp_path / "other.safetensors"
    torch.manual_seed(7)
    save_file({k: v.contiguous() for k, v in timm.create_model(a, pretrained=False).state_dict().items()}, str(other))
    sha = {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in (zoo[a], other)}
    specs, _ = resolve_models([f"test_resnet={zoo[a]}", f"test_resnet={other}"])
    jobs = run_sweep(SweepRequest(models=tuple(specs), suite=str(suite), out=str(tmp_path / "runs"),
                                  options=EvalOptions(**OPTS)))
    ids = sorted(j.model_id for j in jobs)
    assert len(set(ids)) == 2 and all(i.startswith("test_resnet@sha256:") for i in ids)
    for j in jobs:
        assert j.status == "done" and "r160_in1k" not in j.model_id and j.result["model"]["tag"] is None
        assert j.result["model"]["weights_sha256"] == sha[j.spec.checkpoint]
        assert j.result["model"]["declared_name"] == "test_resnet"
    # a name with a tag is the user's claim about the weights, kept as declared_name, never their id
    specs, _ = resolve_models([f"{a}={zoo[a]}"])
    job = run_sweep(SweepRequest(models=tuple(specs), suite=str(suite), out=str(tmp_path / "runs2"),
                                 options=EvalOptions(**OPTS)))[0]  # (in runs: evaluated already)
    assert job.model_id == FOLDER[a].replace("sha256-", "sha256:") and job.result["model"]["declared_name"] == a
    with pytest.raises(BenchError, match="is listed twice"):
        resolve_models([f"test_resnet={zoo[a]}", f"timm/test_resnet={zoo[a]}"])
    with pytest.raises(BenchError, match=r"holds the same weights \(sha256 .*\) as 'test_resnet.r160_in1k'"):
        resolve_models([f"{a}={zoo[a]}", f"test_resnet={zoo[a]}"])
    with pytest.raises(BenchError, match="does not exist"):
        resolve_models([f"test_resnet={tmp_path / 'missing.pth'}"])


def test_each_weights_file_is_hashed_once_persweep(tmp_path, suite, zoo, monkeypatch):
    """The model list check, the first load and the reload of a dropped model (max_resident=1) all
    reuse one digest per file; a file rewritten in place is hashed again."""
    from genshift.eval import models

    archs = ARCHS[:2]
    copies = {a: tmp_path / f"{i}.safetensors" for i, a in enumerate(archs)}  # fresh files: no earlier test's memo
    for a in archs:
        shutil.copy(zoo[a], copies[a])
    hashed = []
    orig = models.sha256_file
    monkeypatch.setattr(models, "sha256_file", lambda p: hashed.append(Path(p).name) or orig(p))
    specs, _ = resolve_models([f"{a}={copies[a]}" for a in archs])
    assert sorted(hashed) == ["0.safetensors", "1.safetensors"]  # the list check hashed each once
    jobs = run_sweep(SweepRequest(models=tuple(specs), suite=str(suite), out=str(tmp_path / "runs"),
                                  options=EvalOptions(**OPTS, max_resident=1)))
    assert [j.status for j in jobs] == ["done", "done"]
    assert sorted(hashed) == ["0.safetensors", "1.safetensors"]  # two loads each, no second read
    for j in jobs:
        assert j.result["model"]["weights_sha256"] == orig(copies[j.spec.name])
    data = copies[archs[0]].read_bytes()
    copies[archs[0]].write_bytes(data)  # same bytes, new mtime: the memo cannot know, so it reads again
    os.utime(copies[archs[0]], ns=(1, 1))
    assert models.weights_sha256(copies[archs[0]]) == orig(copies[archs[0]])
    assert hashed.count("0.safetensors") == 2


def test_each_predictions_file_is_read_back_once(tmp_path, suite, zoo, singles, monkeypatch):
    """Finishing a model reads each predictions file it wrote once: the table it scores and the sha256
    it records come from the same read (counted at every way a file is opened: Python and Arrow)."""
    import builtins
    import io

    import pyarrow.parquet as pq

    reads = []

    def note(src):
        if isinstance(src, (str, os.PathLike)) and Path(src).parent.name == "predictions":
            reads.append(Path(src).parent.parent.name + "/" + Path(src).name)

    def counted(orig):
        def wrapper(src, *a, **kw):
            mode = a[0] if a else kw.get("mode", "r")
            if "r" in mode and "+" not in mode:
                note(src)
            return orig(src, *a, **kw)
        return wrapper

    def counted_arrow(orig):
        return lambda src, *a, **kw: note(src) or orig(src, *a, **kw)

    monkeypatch.setattr(builtins, "open", counted(builtins.open))
    monkeypatch.setattr(io, "open", counted(io.open))
    for name in ("read_table", "ParquetFile", "read_metadata", "read_schema"):
        monkeypatch.setattr(pq, name, counted_arrow(getattr(pq, name)))
    jobs = sweep(tmp_path, suite, zoo)
    assert [j.status for j in jobs] == ["done"] * 3
    assert sorted(reads) == sorted(f"{FOLDER[a]}/{c}.parquet" for a in ARCHS for c in ("base", "shifted"))
    monkeypatch.undo()
    assert files(tmp_path) == files(singles)
    for j in jobs:  # the recorded digest is the file's
        from genshift.fsutil import sha256_file
        for p in j.result["predictions"]:
            assert p["sha256"] == sha256_file(j.run_dir / p["path"])


@pytest.mark.parametrize("argv, match", [
    (["--models", "EMPTY"], "lists no model"),
    ([], "no model given"),
    (["--model", "resnet_nope_*"], "matches no timm pretrained model"),
    (["--model", "test_resnet.r160_in1k", "--model", "timm/test_resnet.r160_in1k"], "is listed twice"),
    (["--model", "test_resnet.r160_in1k", "--model", "test_vit.r160_in1k", "--checkpoint", "x.pth"],
     "--checkpoint applies to one model"),
    (["--models", "TYPO"], "unknown timm model 'resnet5O'. Did you mean"),
    (["--model", "test_vit.r160_in1k="], "needs a checkpoint path"),
    (["--merge", "OUT"], "nothing to merge"),
    (["--models", "/dev/zero"], "is larger than 1048576 bytes"),
    (["--model", "test_resnet.r160_in1k", "--max-resident", "0"], "--max-resident must be in 1..1024"),
])
def test_bad_sweep_input(tmp_path, capsys, argv, match):
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    (tmp_path / "typo.txt").write_text("test_resnet.r160_in1k\nresnet5O\n")
    subs = {"EMPTY": str(tmp_path / "empty.txt"), "TYPO": str(tmp_path / "typo.txt"), "OUT": str(tmp_path)}
    argv = [subs.get(a, a) for a in argv]
    # the suite does not exist: every model problem must be reported before any data is touched
    code = main(["eval", *argv, "--suite", str(tmp_path / "no-such-suite"), "--out", str(tmp_path / "runs"),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and match in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()
