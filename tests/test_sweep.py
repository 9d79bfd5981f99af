"""Sweeps: many models per decode, many processes; every model's files equal a single bench eval's.

Tiny random-weight timm models saved as checkpoints (so every load is the same model), a small
synthetic suite, real subprocesses for kill -9 / SIGTERM and ``accelerate launch --cpu``.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genshift.cli import main
from genshift.errors import BenchError, IntegrityError
from genshift.eval.inference import InferenceOptions
from genshift.eval.runner import EvalRequest, evaluate
from genshift.eval.model_list import ModelSpec, resolve_models
from genshift.eval.sweep import SweepRequest, run_sweep

ARCHS = ("test_convnext.r160_in1k", "test_vit.r160_in1k", "test_resnet.r160_in1k")  # 2 + 1 share a data config
FOLDER: dict[str, str] = {}  # arch -> the run folder of its zoo weights (genshift.identity.folder_name), set by zoo
OPTS = dict(batch_size=4, workers=0, compile="off", unit_rows=4)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Random weights of three tiny 1000-class timm models, as safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    from genshift.identity import canonical_id, folder_name, tensors_sha256

    d = tmp_path_factory.mktemp("zoo")
    out = {}
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(i)
        m = timm.create_model(arch, pretrained=False)
        out[arch] = d / f"{arch}.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(out[arch]))
        FOLDER[arch] = folder_name(canonical_id(source="checkpoint", name=arch.split(".")[0],
                                                tensors_sha256=tensors_sha256(m.state_dict())))
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from genshift.synthetic import make_synthetic_suite

    root = tmp_path_factory.mktemp("s") / "toy"
    make_synthetic_suite(root, configs=("base", "shifted"), classes=range(6), per_class=3, num_shards=2)
    return root


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("predictions/*.parquet"))}


def _sweep(out, suite, zoo, archs=ARCHS, **kw):
    return run_sweep(SweepRequest(models=tuple(ModelSpec(a, str(zoo[a])) for a in archs), suite=str(suite),
                                  out=str(out), inference=InferenceOptions(**OPTS), **kw), progress=False)


@pytest.fixture(scope="module")
def singles(tmp_path_factory, suite, zoo):
    """Each model scored alone by bench eval's library entry point: the reference bytes."""
    out = tmp_path_factory.mktemp("single")
    for a in ARCHS:
        evaluate(EvalRequest(model=a, suite=str(suite), checkpoint=str(zoo[a]), out=str(out),
                             inference=InferenceOptions(**OPTS)), progress=False)
    return out


def test_sweep_equals_single_runs_byte_for_byte(tmp_path, suite, zoo, singles):
    jobs = _sweep(tmp_path, suite, zoo, max_resident=1)  # chunks of one model: the bound is honoured
    assert [j.status for j in jobs] == ["done"] * 3
    ref = _files(singles)
    assert len(ref) == 6 and _files(tmp_path) == ref
    for a in ARCHS:
        r = json.loads((tmp_path / "toy" / FOLDER[a] / "result.json").read_text())
        s = json.loads((singles / "toy" / FOLDER[a] / "result.json").read_text())
        assert r["config_hash"] == s["config_hash"] and r["metrics"] == s["metrics"]
        assert r["run"]["effective_batch_size"] == 4
        assert not (tmp_path / "toy" / FOLDER[a] / ".work").exists()
    # a rerun is a no-op, whatever the grouping
    mtime = (tmp_path / "toy" / FOLDER[ARCHS[0]] / "result.json").stat().st_mtime_ns
    _sweep(tmp_path, suite, zoo)
    assert (tmp_path / "toy" / FOLDER[ARCHS[0]] / "result.json").stat().st_mtime_ns == mtime


def test_one_decode_feeds_every_model_of_a_group(tmp_path, suite, zoo, monkeypatch):
    from genshift.eval import inference

    seen = []
    orig = inference.UnitDataset.__getitem__
    monkeypatch.setattr(inference.UnitDataset, "__getitem__", lambda self, i: seen.append(i) or orig(self, i))
    _sweep(tmp_path, suite, zoo)
    # 2 configs x 5 units of <= 4 rows, decoded once per group (2 groups) -> 20, not 30
    assert len(seen) == 20


def test_plan_lists_items_and_writes_nothing(tmp_path, suite, zoo, capsys):
    models = tmp_path / "zoo.txt"
    models.write_text("".join(f"{a} {zoo[a]}  # tiny\n" for a in ARCHS) + "# comment\n\n")
    assert main(["eval", "--models", str(models), "--suite", str(suite), "--out", str(tmp_path / "runs"),
                 "--plan", "--json", "--workers", "0", "--batch-size", "4"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["groups"]) == 2 and rep["processes"] == 1
    assert sum(i["cost"] for i in rep["items"]) == 3 * 36 and rep["estimated_seconds"] > 0
    # on CPU the overlapped estimate spreads the same work over the process's cores
    from genshift.eval.inference import process_cores
    assert rep["estimated_seconds_all_busy"] == pytest.approx(rep["estimated_seconds"] / process_cores(), abs=0.1)
    assert not list((tmp_path / "runs").rglob("*.json"))


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
    code = main(["eval", "--models", str(models), "--suite", str(suite), "--out", str(tmp_path), "--no-progress",
                 "--workers", "0", "--batch-size", "4", "--compile", "off"])
    out = capsys.readouterr().out
    vit = FOLDER[ARCHS[1]]  # loaded, then failed: under its canonical id's folder
    assert code == 1 and f"2 model(s) failed: {vit.replace('sha256-', 'sha256:')}, test_efficientnet.r160_in1k" in out
    ref = _files(singles)
    got = _files(tmp_path)
    assert {k: v for k, v in ref.items() if "test_vit" not in k} == got
    fail = json.loads((tmp_path / "toy" / vit / "failure.json").read_text())
    assert "illegal memory access" in fail["error"]
    # the rerun retries the failed model only, resuming its written units
    monkeypatch.setattr(inference.Forward, "__call__", orig)
    models.write_text("".join(f"{a} {zoo[a]}\n" for a in ARCHS))
    assert main(["eval", "--models", str(models), "--suite", str(suite), "--out", str(tmp_path), "--no-progress",
                 "--workers", "0", "--batch-size", "4", "--compile", "off"]) == 0
    assert _files(tmp_path) == ref
    assert not (tmp_path / "toy" / vit / "failure.json").exists()


def test_interrupted_sweep_resumes_identically(tmp_path, suite, zoo, singles, monkeypatch):
    from genshift.eval import predictions as P

    orig_add = P.CheckpointedPredictions.add
    calls = {"n": 0}

    def flaky(self, unit, block, **kw):
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        orig_add(self, unit, block, **kw)

    monkeypatch.setattr(P.CheckpointedPredictions, "add", flaky)
    monkeypatch.setattr(P.CheckpointedPredictions, "__init__", _flush_every_unit(P.CheckpointedPredictions.__init__))
    with pytest.raises(KeyboardInterrupt):
        _sweep(tmp_path, suite, zoo)
    assert list(tmp_path.rglob("part-*.parquet"))
    monkeypatch.setattr(P.CheckpointedPredictions, "add", orig_add)
    jobs = _sweep(tmp_path, suite, zoo)
    assert _files(tmp_path) == _files(singles)
    resumed = sum(t["resumed_units"] for j in jobs for t in j.result["run"]["timings"].values())
    # every unit added before the stop was kept: 8 before the interrupt, plus those the other group in
    # flight finished on its way to its next unit boundary
    assert calls["n"] >= 9 and resumed == calls["n"] - 1


def _flush_every_unit(init):
    def wrapped(self, *a, **kw):
        kw["flush_rows"] = 1
        init(self, *a, **kw)
    return wrapped


def _cli(*args, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "TQDM_DISABLE": "1"}
    env.update(env_extra or {})
    return env, [sys.executable, "-m", "genshift", "eval", *args]


LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # accelerate's multi-process launcher; with --device cpu the sweep asks accelerate for a CPU (gloo) group
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"],
    # accelerate's --cpu launcher starts ONE process (without an MPI host file): a world of one, all units rank 0
    "accelerate-cpu": ["-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                       "--mixed_precision", "no", "--dynamo_backend", "no"],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_launched_processes_each_do_their_units_and_equal_one_process(tmp_path, suite, zoo, singles, launcher):
    models = tmp_path / "zoo.txt"
    models.write_text("".join(f"{a} {zoo[a]}\n" for a in ARCHS))
    env, cmd = _cli("--models", str(models), "--suite", str(suite), "--out", str(tmp_path / "two"), "--workers", "0",
                    "--batch-size", "4", "--compile", "off", "--no-progress", "--device", "cpu", "--cpu-threads", "1")
    env.pop("WORLD_SIZE", None), env.pop("RANK", None), env.pop("LOCAL_RANK", None)
    p = subprocess.run([sys.executable, *LAUNCHERS[launcher], "-m", "genshift", *cmd[3:]], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # the bytes of one process at the same (recorded) thread count
    assert _files(tmp_path / "two") == _files(singles)
    assert not list((tmp_path / "two").rglob(".work")) and not list((tmp_path / "two").rglob("part-*"))
    world = 1 if launcher == "accelerate-cpu" else 2
    for a in ARCHS:
        r = json.loads((tmp_path / "two" / "toy" / FOLDER[a] / "result.json").read_text())
        assert r["run"]["processes"] == world and r["run"]["cpu_threads"] == 1
        assert r["counts"]["base"]["predicted"] == 18
        # which process wrote which units, from the part sidecars each process wrote
        by_rank = {k: sum(t["units_by_rank"].get(k, 0) for t in r["run"]["timings"].values()) for k in ("0", "1")}
        assert sum(by_rank.values()) == 2  # 2 configs x 1 unit of up to 200 rows
        assert by_rank == ({"0": 1, "1": 1} if world == 2 else {"0": 2, "1": 0}), by_rank


@pytest.mark.parametrize("env, match", [
    ({"WORLD_SIZE": "2"}, "is set but no rank (RANK)"),
    ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}, "disagree (a rank is below the world size)"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE='two' is not a whole number"),
    ({"RANK": "1"}, "RANK=1 is set but no world size"),
    ({"WORLD_SIZE": "2", "RANK": "1"}, "no local rank (LOCAL_RANK)"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "disagree"),
    ({"WORLD_SIZE": "99999999999", "RANK": "0"}, "is not a whole number in 0..4096"),
    ({"ACCELERATE_USE_CPU": "True", "DEVICE": "cuda"}, "launched with `accelerate launch --cpu` but --device cuda"),
])
def test_unreadable_launcher_environment_is_one_line(tmp_path, suite, zoo, capsys, monkeypatch, env, match):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(k, raising=False)
    env = dict(env)
    device = env.pop("DEVICE", "cpu")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    a = ARCHS[0]
    code = main(["eval", "--model", f"{a}={zoo[a]}", "--suite", str(suite), "--out", str(tmp_path / "runs"),
                 "--no-progress", "--workers", "0", "--device", device])
    err = capsys.readouterr().err
    assert code != 0 and match in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_resume_with_another_thread_count_is_refused(tmp_path, suite, zoo, monkeypatch, capsys):
    from genshift.eval import predictions as P

    a = ARCHS[0]
    orig_add = P.CheckpointedPredictions.add

    def stop(self, unit, block, **kw):
        if self.dir.name == "shifted":  # killed after config base was written
            raise KeyboardInterrupt
        orig_add(self, unit, block, **kw)

    monkeypatch.setattr(P.CheckpointedPredictions, "add", stop)
    monkeypatch.setattr(P.CheckpointedPredictions, "__init__", _flush_every_unit(P.CheckpointedPredictions.__init__))
    argv = ["eval", "--model", f"{a}={zoo[a]}", "--suite", str(suite), "--out", str(tmp_path), "--no-progress",
            "--workers", "0", "--batch-size", "4", "--compile", "off"]
    assert main(argv) != 0
    parts = sorted(p.name for p in tmp_path.rglob("part-*.parquet"))
    assert parts
    monkeypatch.setattr(P.CheckpointedPredictions, "add", orig_add)
    capsys.readouterr()
    assert main([*argv, "--cpu-threads", "2"]) != 0
    err = capsys.readouterr().err
    assert "holds a run of this model and suite with other settings" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("part-*.parquet")) == parts  # nothing mixed, nothing removed
    assert main(argv) == 0  # the same thread count resumes
    r = json.loads((tmp_path / "toy" / FOLDER[a] / "result.json").read_text())
    assert r["run"]["cpu_threads"] == 1 and r["run"]["timings"]["base"]["resumed_units"] == len(parts)


@pytest.fixture(scope="module")
def big(tmp_path_factory, zoo):
    """A suite big enough that a signal lands mid-run (2 x 80 images of 256 px), and the reference run."""
    from genshift.synthetic import make_synthetic_suite

    d = tmp_path_factory.mktemp("big")
    make_synthetic_suite(d / "big", suite_id="big", configs=("base", "shifted"), classes=range(16), per_class=5,
                         image_size=256)
    a = ARCHS[0]
    evaluate(EvalRequest(model=a, suite=str(d / "big"), checkpoint=str(zoo[a]), out=str(d / "ref"),
                         inference=InferenceOptions(**OPTS)), progress=False)
    return d / "big", _files(d / "ref")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_process_resumes_byte_identical(tmp_path, big, zoo, sig):
    suite, ref = big
    a = ARCHS[0]
    env, cmd = _cli("--model", f"{a}={zoo[a]}", "--suite", str(suite), "--out", str(tmp_path), "--workers", "0",
                    "--batch-size", "4", "--compile", "off", "--no-progress")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    work = tmp_path / "big" / FOLDER[a] / ".work"
    deadline = time.time() + 300
    while not list(work.glob("base/part-*.parquet")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if (tmp_path / "big" / FOLDER[a] / "result.json").exists():
        pytest.skip("the run finished before the signal landed")
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and "rerun resumes" in err, err
    # leftovers of a killed run: a temp file is cleaned, finished units are kept
    stray = work / "base" / "part-0000009-0000009.parquet.abc.incomplete"
    stray.write_bytes(b"half")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert not stray.exists() and not work.exists()
    assert _files(tmp_path) == ref
    r = json.loads((tmp_path / "big" / FOLDER[a] / "result.json").read_text())
    assert r["run"]["timings"]["base"]["resumed_units"] > 0


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
                                  pretrained=False, inference=InferenceOptions(**OPTS)), progress=False)
    r = jobs[0].result
    assert r["run"]["wildcard"] == {"pattern": "test_vit3*", "expansion": ["test_vit3.r160_in1k"]}
    assert "wildcard" not in json.dumps(r["protocol"])


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
    (["--model", "test_resnet.r160_in1k", "--groups-in-flight", "0"], "--groups-in-flight must be in 1..64"),
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


def test_merge_names_missing_units_then_builds(tmp_path, suite, zoo, singles, monkeypatch):
    from genshift.eval import merging, work_split

    a = ARCHS[2]
    # a 2-process sweep where only process 0 ran: half the units are missing
    monkeypatch.setattr(work_split.Distributed, "__init__", _fake_world(2, 0))
    jobs = _sweep(tmp_path, suite, zoo, archs=(a,))
    assert jobs[0].result is None and (tmp_path / "toy" / FOLDER[a] / ".work").is_dir()
    with pytest.raises(BenchError, match=rf"units missing: toy/{FOLDER[a]}: config base: unit\(s\) "):
        merging.merge(tmp_path)
    monkeypatch.undo()
    _sweep(tmp_path, suite, zoo, archs=(a,))  # the rerun (one process here) does the rest and builds the result
    assert _files(tmp_path) == {k: v for k, v in _files(singles).items() if FOLDER[a] in k}


def _fake_world(world, rank):
    def init(self, device="cpu"):
        self.world, self.rank, self.local_rank, self.state, self.is_main = world, rank, rank, None, rank == 0
    return init


def test_config_names_cannot_reach_outside_out(tmp_path, suite, zoo, monkeypatch):
    from genshift.eval.predictions import CheckpointedPredictions, schema

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    work = tmp_path / "runs" / "toy" / "m" / ".work"
    for name in ("../../../../victim", "..", "/etc", "a/b"):
        with pytest.raises(IntegrityError, match="cannot be used as a file or folder name"):
            CheckpointedPredictions(work, name, schema())
    from genshift.eval import sweep

    real_open = sweep.open_suite

    def hostile_open(*a, **kw):  # a verified suite whose manifest then names a config '../../../victim'
        info = real_open(*a, **kw)
        cfgs = info.suite.manifest.configs
        cfgs["../../../victim"] = cfgs.pop("base")
        return info

    monkeypatch.setattr(sweep, "open_suite", hostile_open)
    with pytest.raises(IntegrityError, match="cannot be used as a file or folder name"):
        _sweep(tmp_path / "runs", suite, zoo, archs=ARCHS[:1])
    assert (victim / "keep.txt").read_text() == "precious"
    # the containment check itself, for a path that escapes through a symlink
    (work).mkdir(parents=True, exist_ok=True)
    (work / "link").symlink_to(victim)
    ck = CheckpointedPredictions.__new__(CheckpointedPredictions)
    ck.work_dir, ck.dir, ck.schema, ck._pending = work, work / "link", schema(), []
    with pytest.raises(IntegrityError, match="not inside"):
        ck.finish(tmp_path / "runs" / "x.parquet")
    assert (victim / "keep.txt").read_text() == "precious"


def test_decode_device_cpu_path_agrees_and_is_recorded(tmp_path, lite0_weights):
    """--decode device (torchvision.io.decode_jpeg + tensor resize/crop) on CPU: real photos get the
    default path's top-1, a PNG is decoded too, a broken JPEG is named and skipped; the protocol says so."""
    import io

    import numpy as np
    import pyarrow.parquet as pq
    from PIL import Image
    from skimage import data

    from genshift.writer import SuiteWriter

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
        res[mode], path = evaluate(EvalRequest(
            model="tf_efficientnet_lite0", checkpoint=lite0_weights, remap_by_order=True, suite=str(tmp_path / "photos"),
            out=str(tmp_path / mode), inference=InferenceOptions(workers=0, compile="off", decode=mode,
                                                                 skip_bad_images=True)), progress=False)
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
    jobs = _sweep(tmp_path, suite, zoo, archs=ARCHS[2:])
    r = jobs[0].result
    assert r["run"]["batch_size"] == 4 and r["run"]["effective_batch_size"] == 2
    assert r["run"]["timings"]["base"]["effective_batch_size"] == 2


@pytest.fixture(scope="module")
def split_run(tmp_path_factory, suite, zoo):
    """A finished 2-process sweep of one model whose result was not built yet: parts of both processes."""
    from genshift.eval import merging, sweep, work_split

    out = tmp_path_factory.mktemp("split")
    a = ARCHS[2]
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sweep, "finish_run", lambda *a, **kw: {})  # leave the parts for --merge
        # the processes one after the other: each splits what is left, so alternate until all is done
        for rank in (0, 1, 0, 1, 0, 1):
            mp.setattr(work_split.Distributed, "__init__", _fake_world(2, rank))
            _sweep(out, suite, zoo, archs=(a,))
            if not merging.missing_units(out / "toy" / FOLDER[a], out):
                break
    finally:
        mp.undo()
    work = out / "toy" / FOLDER[a] / ".work"
    assert {p.parent.name for p in work.rglob("part-*.parquet")} == {"base", "shifted"}
    return out


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<link>")
            for p in sorted(root.rglob("*"))}


def _rename_part(d: Path, old: str, new: str) -> None:
    (d / f"{old}.parquet").rename(d / f"{new}.parquet")
    (d / f"{old}.json").rename(d / f"{new}.json")


def _hostile(case: str, run: Path, other: Path) -> None:
    import pyarrow.parquet as pq

    base = run / ".work" / "base"
    parts = sorted(p.stem for p in base.glob("part-*.parquet"))
    first = base / f"{parts[0]}.parquet"
    if case == "truncated":
        first.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    elif case == "schema":
        t = pq.read_table(first)
        pq.write_table(t.drop_columns(["pair_id"]), first)
    elif case == "overlap":  # a copy of the first part under a name that overlaps it
        lo = int(parts[0].split("-")[1])
        side = json.loads((base / f"{parts[0]}.json").read_text())
        first.with_name(f"part-{lo:07d}-{lo + 1:07d}.parquet").write_bytes(first.read_bytes())
        (base / f"part-{lo:07d}-{lo + 1:07d}.json").write_text(json.dumps({**side, "units": [lo, lo + 1]}))
    elif case in ("more_units_than_rows", "more_units_forged_sidecar"):
        # the part after the first is removed and the first renamed to cover its units too
        lo, hi = (int(x) for x in parts[0].split("-")[1:])
        nxt = next(p for p in parts if int(p.split("-")[1]) == hi + 1)
        end = int(nxt.split("-")[2])
        (base / f"{nxt}.parquet").unlink()
        (base / f"{nxt}.json").unlink()
        _rename_part(base, parts[0], f"part-{lo:07d}-{end:07d}")
        if case == "more_units_forged_sidecar":
            side_path = base / f"part-{lo:07d}-{end:07d}.json"
            side = json.loads(side_path.read_text())
            extra = end - hi
            side_path.write_text(json.dumps({**side, "units": list(range(lo, end + 1)),
                                             "rows_per_unit": side["rows_per_unit"] + [0] * extra,
                                             "skipped_per_unit": side["skipped_per_unit"] + [[]] * extra}))
    elif case == "other_model":  # another model's part (same units) in place of this one's
        o = other / ".work" / "base" / f"{parts[0]}.parquet"
        first.write_bytes(o.read_bytes())
        (base / f"{parts[0]}.json").write_bytes(o.with_suffix(".json").read_bytes())
    elif case == "huge_name":
        (base / "part-0000000-9999999999.parquet").write_bytes(b"x")
    elif case == "beyond_units":
        (base / "part-0000000-9999999.parquet").write_bytes(b"x")
    elif case in ("job_huge_units", "job_missing_key", "job_wrong_type"):
        job = json.loads((run / ".work" / "job.json").read_text())
        if case == "job_huge_units":
            job["units"]["base"] = 1e12
        elif case == "job_missing_key":
            del job["units"]
        else:
            job["counts"] = "many"
        (run / ".work" / "job.json").write_text(json.dumps(job))
    elif case == "work_symlink":  # this run's .work is a link to another run's
        shutil.rmtree(run / ".work")
        (run / ".work").symlink_to(other / ".work")


@pytest.mark.parametrize("case, match", [
    ("truncated", "is not readable parquet"),
    ("schema", "has another schema"),
    ("overlap", "overlaps part"),
    ("more_units_than_rows", "its sidecar lists other units than its name"),
    ("more_units_forged_sidecar", "are not that unit's images"),
    ("other_model", "was written by another run"),
    ("huge_name", "not a part name"),
    ("beyond_units", "are not inside this run's 0..4"),
    ("job_huge_units", "units of config 'base' is not a whole number in 0..1000000"),
    ("job_missing_key", "key 'units' is missing"),
    ("job_wrong_type", "key 'counts' is not a dict"),
    ("work_symlink", "is a symbolic link"),
])
def test_hostile_merge_is_one_line_and_touches_nothing(tmp_path, split_run, suite, zoo, capsys, case, match):
    out = tmp_path / "out"
    shutil.copytree(split_run, out, symlinks=True)
    a = ARCHS[2]
    run = out / "toy" / FOLDER[a]
    # another model's unfinished run (same suite, same units), outside this --out
    other_out = tmp_path / "other"
    shutil.copytree(split_run, other_out, symlinks=True)
    other = other_out / "toy" / FOLDER[a]
    for side in (other / ".work").rglob("part-*.json"):  # as another model's run would have written them
        side.write_text(json.dumps({**json.loads(side.read_text()), "run_key": "0" * 64}))
    _hostile(case, run, other)
    before, before_other = _snapshot(out), _snapshot(other_out)
    code = main(["eval", "--merge", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: ") and err.count("\n") == 1, err
    assert match in err, err
    assert _snapshot(out) == before and _snapshot(other_out) == before_other
    assert not (run / "result.json").exists()


def test_merge_of_a_split_run_builds_the_single_run_bytes(tmp_path, split_run, singles):
    out = tmp_path / "out"
    shutil.copytree(split_run, out)
    assert main(["eval", "--merge", str(out)]) == 0
    a = ARCHS[2]
    assert _files(out) == {k: v for k, v in _files(singles).items() if FOLDER[a] in k}
    r = json.loads((out / "toy" / FOLDER[a] / "result.json").read_text())
    assert not r["flags"]["partial"] and r["counts"]["base"]["predicted"] == 18
    assert set(r["run"]["timings"]["base"]["units_by_rank"]) == {"0", "1"}


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
                                  inference=InferenceOptions(**OPTS)), progress=False)
    ids = sorted(j.model_id for j in jobs)
    assert len(set(ids)) == 2 and all(i.startswith("test_resnet@sha256:") for i in ids)
    for j in jobs:
        assert j.status == "done" and "r160_in1k" not in j.model_id and j.result["model"]["tag"] is None
        assert j.result["model"]["weights_sha256"] == sha[j.spec.checkpoint]
        assert j.result["model"]["declared_name"] == "test_resnet"
    # a name with a tag is the user's claim about the weights, kept as declared_name, never their id
    specs, _ = resolve_models([f"{a}={zoo[a]}"])
    job = run_sweep(SweepRequest(models=tuple(specs), suite=str(suite), out=str(tmp_path / "runs2"),
                                 inference=InferenceOptions(**OPTS)), progress=False)[0]  # (in runs: evaluated)
    assert job.model_id == FOLDER[a].replace("sha256-", "sha256:") and job.result["model"]["declared_name"] == a
    with pytest.raises(BenchError, match="is listed twice"):
        resolve_models([f"test_resnet={zoo[a]}", f"timm/test_resnet={zoo[a]}"])
    with pytest.raises(BenchError, match=r"holds the same weights \(sha256 .*\) as 'test_resnet.r160_in1k'"):
        resolve_models([f"{a}={zoo[a]}", f"test_resnet={zoo[a]}"])
    with pytest.raises(BenchError, match="does not exist"):
        resolve_models([f"test_resnet={tmp_path / 'missing.pth'}"])


def test_each_weights_file_is_hashed_once_per_sweep(tmp_path, suite, zoo, monkeypatch):
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
                                  inference=InferenceOptions(**OPTS), max_resident=1), progress=False)
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
    jobs = _sweep(tmp_path, suite, zoo)
    assert [j.status for j in jobs] == ["done"] * 3
    assert sorted(reads) == sorted(f"{FOLDER[a]}/{c}.parquet" for a in ARCHS for c in ("base", "shifted"))
    monkeypatch.undo()
    assert _files(tmp_path) == _files(singles)
    for j in jobs:  # the recorded digest is the file's
        from genshift.fsutil import sha256_file
        for p in j.result["predictions"]:
            assert p["sha256"] == sha256_file(j.run_dir / p["path"])


def _three_groups(tmp_path, zoo) -> tuple[ModelSpec, ...]:
    """Three models, three data configs: chunks of one model each."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(3)
    m = timm.create_model("test_efficientnet.r160_in1k", pretrained=False)  # a third data config
    third = tmp_path / "effnet.safetensors"
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(third))
    return (ModelSpec(ARCHS[0], str(zoo[ARCHS[0]])), ModelSpec(ARCHS[2], str(zoo[ARCHS[2]])),
            ModelSpec("test_efficientnet.r160_in1k", str(third)))


def test_next_model_loads_while_the_current_one_runs(tmp_path, suite, zoo, monkeypatch):
    """Three preprocessing groups, max_resident=2: while one chunk's forward runs, the next model loads
    in a background thread (its load starts before that forward ends) and the models loaded never exceed
    the bound; the files are byte-identical to the sequential path's."""
    import threading

    from genshift.eval import sweep

    specs = _three_groups(tmp_path, zoo)

    names = {}

    def run(out, preload):
        events, resident, lock = [], set(), threading.Lock()
        orig_load, orig_predict = sweep.load_model, sweep.predict_units

        def load(req, spec):
            with lock:
                events.append(("load", spec.name, threading.current_thread().name))
            clf = orig_load(req, spec)
            with lock:
                resident.add(id(clf.model))
                names[clf.model_id] = spec.name  # forwards are named by the model's canonical id
            import weakref
            weakref.finalize(clf.model, resident.discard, id(clf.model))
            return clf

        def predict(suite_, config, feeds, *a, **kw):
            names = tuple(f.name for f in feeds)
            with lock:
                events.append(("forward", names, len(resident)))
            orig_predict(suite_, config, feeds, *a, **kw)
            with lock:
                events.append(("forward end", names, len(resident)))

        monkeypatch.setattr(sweep, "load_model", load)
        monkeypatch.setattr(sweep, "predict_units", predict)
        # one group at a time: the preload's own effect (groups in flight are tested below)
        jobs = run_sweep(SweepRequest(models=specs, suite=str(suite), out=str(out), max_resident=2, preload=preload,
                                      groups_in_flight=1, inference=InferenceOptions(**OPTS)), progress=False)
        monkeypatch.undo()
        assert [j.status for j in jobs] == ["done"] * 3
        return events

    seq, pre = run(tmp_path / "seq", False), run(tmp_path / "pre", True)
    assert _files(tmp_path / "pre") == _files(tmp_path / "seq") and len(_files(tmp_path / "seq")) == 6
    for a in ("seq", "pre"):
        for j in (tmp_path / a / "toy").iterdir():
            assert json.loads((j / "result.json").read_text())["metrics"] == \
                json.loads((tmp_path / "seq" / "toy" / j.name / "result.json").read_text())["metrics"]
    assert not any(e[0] == "load" and e[2].startswith("sweep-preload") for e in seq)
    # the background load of the third chunk's model started while the second chunk's forward ran
    forwards = [e[1] for e in pre if e[0] == "forward"]
    assert len({f for f in forwards}) == 3
    last = forwards[-1][0]
    bg = [i for i, e in enumerate(pre) if e[0] == "load" and e[1] == names[last] and e[2].startswith("sweep-preload")]
    assert len(bg) == 1
    prev_end = max(i for i, e in enumerate(pre) if e[0] == "forward end" and e[1] != forwards[-1])
    assert bg[0] < prev_end
    assert max(e[2] for e in pre if e[0].startswith("forward")) <= 2  # the bound holds with the preload


def test_a_failed_background_load_fails_that_model_only(tmp_path, suite, zoo, monkeypatch):
    """Models whose background load raises are recorded as failed when their chunk starts; the others finish."""
    import threading

    from genshift.eval import sweep

    orig, background = sweep.load_model, []

    def load(req, spec):
        if threading.current_thread().name.startswith("sweep-preload"):
            background.append(spec.name)
            raise OSError("weights vanished")
        return orig(req, spec)

    specs = _three_groups(tmp_path, zoo)
    monkeypatch.setattr(sweep, "load_model", load)
    jobs = run_sweep(SweepRequest(models=specs, suite=str(suite), out=str(tmp_path / "runs"), max_resident=2,
                                  inference=InferenceOptions(**OPTS)), progress=False)
    failed = [j for j in jobs if j.status == "failed"]
    assert background and sorted(j.spec.name for j in failed) == sorted(background)
    for j in failed:
        assert "weights vanished" in j.error and "weights vanished" in (j.run_dir / "failure.json").read_text()
    assert sum(j.status == "done" for j in jobs) == 3 - len(failed)


def _timed_sweep(out, suite, specs, workers=0, **kw):
    """A sweep whose timeline (genshift.eval.busy) the test reads; every model must finish."""
    from genshift.eval.sweep import Sweep

    sw = Sweep(SweepRequest(models=specs, suite=str(suite), out=str(out),
                            inference=InferenceOptions(**{**OPTS, "workers": workers}), **kw), progress=False)
    assert [j.status for j in sw.run()] == ["done"] * len(specs)
    return sw


def _single_runs(out, suite, specs):
    for spec in specs:  # a single bench eval is a sweep of one model
        run_sweep(SweepRequest(models=(spec,), suite=str(suite), out=str(out), inference=InferenceOptions(**OPTS)),
                  progress=False)
    return _files(out)


def test_groups_in_flight_overlap_and_write_single_run_bytes(tmp_path, big, zoo):
    """Three preprocessing groups, two in flight: the second group's loader starts and its first unit is
    decoded before the first group's last forward ends, and two groups' forwards run at the same time;
    one in flight without decode-ahead runs each group after the previous one's last forward. Every
    model's files are a single run's bytes either way. (The big
    suite: 40 units per group, so a group outlasts the start of the next one's thread on a loaded CPU.)"""
    from genshift.eval.busy import chunk_spans

    suite, _ = big
    specs = _three_groups(tmp_path, zoo)
    par = _timed_sweep(tmp_path / "par", suite, specs, groups_in_flight=2)
    seq = _timed_sweep(tmp_path / "seq", suite, specs, groups_in_flight=1, decode_ahead=False)
    ref = _single_runs(tmp_path / "single", suite, specs)
    assert len(ref) == 6 and _files(tmp_path / "par") == ref == _files(tmp_path / "seq")
    for j in par.jobs:
        assert j.result["metrics"] == json.loads((tmp_path / "single" / "big" / j.run_dir.name / "result.json")
                                                 .read_text())["metrics"]

    spans = chunk_spans(par.timeline)
    assert sorted(spans) == [0, 1, 2] and len(par.timeline) == 3 * 2 * 20  # chunks x configs x units
    assert spans[1]["first_decode"] < spans[0]["last_forward_end"]
    fwd = {c: [s for e in par.timeline if e["chunk"] == c for s in e["forward"].values()] for c in spans}
    assert any(a0 < b1 and b0 < a1 for a0, a1 in fwd[0] for b0, b1 in fwd[1])  # two groups computed at once
    spans = chunk_spans(seq.timeline)
    for k in (1, 2):
        assert spans[k]["first_decode"] > spans[k - 1]["last_forward_end"]
    assert par.busy["units"] == 120 and par.busy["model_s"] > 0 and par.busy["decode_s"] > 0


def test_next_stream_decodes_while_the_current_one_runs(tmp_path, suite, zoo):
    """One group at a time, one DataLoader worker per stream: with decode-ahead each stream (a chunk's
    config) starts its loader, whose worker decodes at once, before the previous stream's last forward
    ends; without it, only after. Same bytes."""
    specs = _three_groups(tmp_path, zoo)
    on = _timed_sweep(tmp_path / "on", suite, specs, workers=1, groups_in_flight=1)
    off = _timed_sweep(tmp_path / "off", suite, specs, workers=1, groups_in_flight=1, decode_ahead=False)
    assert _files(tmp_path / "on") == _files(tmp_path / "off") and len(_files(tmp_path / "on")) == 6

    def streams(sw):
        out = {}
        for e in sw.timeline:
            s = out.setdefault((e["chunk"], e["config"]), {"started": e["loader_started"], "end": 0.0, "pids": set()})
            s["end"] = max([s["end"], *(b for _, b in e["forward"].values())])
            s["pids"].add(e["decoded"][2])
        return [out[k] for k in sw._stream_order]

    a, b = streams(on), streams(off)
    assert len(a) == len(b) == 6
    assert all(os.getpid() not in s["pids"] for s in a)  # decoded by the workers
    for prev, nxt in zip(a, a[1:]):
        assert nxt["started"] < prev["end"]
    for prev, nxt in zip(b, b[1:]):
        assert nxt["started"] > prev["end"]


def test_costliest_group_runs_first(tmp_path):
    """Chunks start in order of models x input pixels, largest first (ties by group key)."""
    from genshift.eval.sweep import Job, Sweep

    sw = Sweep(SweepRequest(models=(), suite="unused", max_resident=2), progress=False)
    sizes = {"a": (224, 1), "b": (260, 1), "c": (240, 1), "d": (160, 3)}  # group -> (pixels, models)
    for g, (px, n) in sizes.items():
        for i in range(n):
            sw.jobs.append(Job(ModelSpec(f"{g}{i}"), None, f"{g}{i}", tmp_path,
                               {"group": g, "data_config": {"input_size": [3, px, px]}}))
    # d: 3 x 160^2 = 76,800 > b: 67,600 > c: 57,600 > a: 50,176; d's three models in chunks of 2
    assert [[j.model_id for j in c] for c in sw.chunks()] == [["d0", "d1"], ["d2"], ["b0"], ["c0"], ["a0"]]


def test_busy_shares_of_a_hand_made_timeline():
    """genshift.eval.busy on a timeline computed by hand: two units of one loader (one worker), one model."""
    from genshift.eval.busy import busy_shares

    timeline = [
        {"chunk": 0, "config": "c", "unit": 0, "loader_started": 0.0, "decoded": (0.5, 2.0, 7),
         "waited": (0.0, 2.0), "forward": {"m": (2.0, 6.0)}},
        {"chunk": 0, "config": "c", "unit": 1, "loader_started": 0.0, "decoded": (2.0, 3.0, 7),
         "waited": (6.0, 6.0), "forward": {"m": (6.0, 8.0)}},
    ]
    b = busy_shares(timeline, 10.0)
    # forward 4 + 2 = 6 s; decode 1.5 + 1 = 2.5 s; the model waited 2 s for the first unit; the worker
    # went straight from unit 0 to unit 1 (no gap); its loader took 0.5 s to start
    assert (b["model_s"], b["decode_s"], b["model_wait_s"], b["worker_wait_s"], b["loader_start_s"]) == \
        (6.0, 2.5, 2.0, 0.0, 0.5)
    assert (b["model_busy"], b["decode_busy"], b["model_wait_share"]) == (0.6, 0.25, 0.2)
    timeline[1]["decoded"] = (5.0, 6.0, 7)  # the prefetch queue was full: the worker waited 3 s
    assert busy_shares(timeline, 10.0)["worker_wait_s"] == 3.0


def test_sigterm_stops_every_group_in_flight_at_a_unit_and_resumes(tmp_path, big, zoo):
    """SIGTERM to a sweep running two groups at once: both stop at their next unit boundary with
    what they finished flushed, the process exits 143, and the rerun writes the bytes of an
    uninterrupted sweep."""
    suite, _ = big
    archs = (ARCHS[0], ARCHS[2])  # two data configs: two groups in flight
    mfile = tmp_path / "zoo.txt"
    mfile.write_text("".join(f"{a} {zoo[a]}\n" for a in archs))
    ref = tmp_path / "ref"
    _sweep(ref, suite, zoo, archs=archs)
    out = tmp_path / "run"
    env, cmd = _cli("--models", str(mfile), "--suite", str(suite), "--out", str(out), "--workers", "0",
                    "--batch-size", "4", "--compile", "off", "--no-progress", "--groups-in-flight", "2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    works = [out / "big" / FOLDER[a] / ".work" for a in archs]
    deadline = time.time() + 300
    while (not all(list(w.glob("base/part-*.parquet")) for w in works) and proc.poll() is None
           and time.time() < deadline):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if any((out / "big" / FOLDER[a] / "result.json").exists() for a in archs):
        pytest.skip("a group finished before the signal landed")
    assert proc.returncode == 143 and "rerun resumes" in err, err
    assert all(list(w.glob("base/part-*.parquet")) for w in works)  # both groups had flushed their units
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert _files(out) == _files(ref) and len(_files(ref)) == 4
    for a in archs:
        r = json.loads((out / "big" / FOLDER[a] / "result.json").read_text())
        assert r["run"]["timings"]["base"]["resumed_units"] > 0


def test_groups_in_flight_and_preload_never_hold_more_than_max_resident(tmp_path, big, zoo, monkeypatch):
    """Two groups in flight, the background preload on, max_resident=2, three one-model groups: the
    models alive (loaded, by the preload or by a chunk) never exceed 2 at any forward; the third
    group waits for a slot, and the bytes are the one-at-a-time run's."""
    import threading
    import weakref

    from genshift.eval import sweep

    suite, _ = big  # 40 units per group: the first group outlasts the start of the second's thread
    specs = _three_groups(tmp_path, zoo)
    alive, peak, lock = set(), [0], threading.Lock()
    orig_load, orig_predict = sweep.load_model, sweep.predict_units

    def load(req, spec):
        clf = orig_load(req, spec)
        with lock:
            alive.add(id(clf.model))
        weakref.finalize(clf.model, alive.discard, id(clf.model))
        return clf

    def predict(*a, **kw):
        import gc

        gc.collect()  # a model dropped by the sweep is gone, not merely unreferenced
        with lock:
            peak[0] = max(peak[0], len(alive))
        return orig_predict(*a, **kw)

    monkeypatch.setattr(sweep, "load_model", load)
    monkeypatch.setattr(sweep, "predict_units", predict)
    par = _timed_sweep(tmp_path / "par", suite, specs, max_resident=2, groups_in_flight=2)
    monkeypatch.undo()
    seq = _timed_sweep(tmp_path / "seq", suite, specs, groups_in_flight=1, decode_ahead=False)
    assert _files(tmp_path / "par") == _files(tmp_path / "seq") and len(_files(tmp_path / "seq")) == 6
    assert 1 <= peak[0] <= 2
    from genshift.eval.busy import chunk_spans

    spans = chunk_spans(par.timeline)
    assert spans[1]["first_decode"] < spans[0]["last_forward_end"]  # two groups did run at once
    assert spans[2]["first_decode"] > min(spans[0]["last_forward_end"], spans[1]["last_forward_end"])
