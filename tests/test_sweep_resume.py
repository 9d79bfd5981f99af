"""Killed, interrupted and split sweeps resume and merge into the bytes of an uninterrupted one; a merge
checks what every part holds before building anything. Shared fixtures: tests/sweepkit.py."""

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from genshift import evaluate
from genshift.cli import main
from genshift.errors import BenchError
from tests.sweepkit import ARCHS, CLI_OPTS, FOLDER, OPTS, cli, fake_world, files, flush_every_unit, sweep


def test_interrupted_sweep_resumes_identically(tmp_path, suite, zoo, singles, monkeypatch):
    from genshift.eval import merging as P

    orig_add = P.CheckpointedPredictions.add
    calls = {"n": 0}

    def flaky(self, unit, block, **kw):
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        orig_add(self, unit, block, **kw)

    monkeypatch.setattr(P.CheckpointedPredictions, "add", flaky)
    monkeypatch.setattr(P.CheckpointedPredictions, "__init__", flush_every_unit(P.CheckpointedPredictions.__init__))
    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path, suite, zoo)
    assert list(tmp_path.rglob("part-*.parquet"))
    monkeypatch.setattr(P.CheckpointedPredictions, "add", orig_add)
    jobs = sweep(tmp_path, suite, zoo)
    assert files(tmp_path) == files(singles)
    resumed = sum(t["resumed_units"] for j in jobs for t in j.result["run"]["timings"].values())
    assert resumed == 8  # every unit added before the stop was kept


def test_resume_with_another_thread_count_is_refused(tmp_path, suite, zoo, monkeypatch, capsys):
    from genshift.eval import merging as P

    a = ARCHS[0]
    orig_add = P.CheckpointedPredictions.add

    def stop(self, unit, block, **kw):
        if self.dir.name == "shifted":  # killed after config base was written
            raise KeyboardInterrupt
        orig_add(self, unit, block, **kw)

    monkeypatch.setattr(P.CheckpointedPredictions, "add", stop)
    monkeypatch.setattr(P.CheckpointedPredictions, "__init__", flush_every_unit(P.CheckpointedPredictions.__init__))
    argv = ["eval", "--model", f"{a}={zoo[a]}", "--suite", str(suite), "--out", str(tmp_path), *CLI_OPTS]
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
    evaluate(f"{a}={zoo[a]}", str(d / "big"), out=d / "ref", **OPTS)
    return d / "big", files(d / "ref")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_process_resumes_byte_identical(tmp_path, big, zoo, sig):
    suite, ref = big
    a = ARCHS[0]
    env, cmd = cli("--model", f"{a}={zoo[a]}", "--suite", str(suite), "--out", str(tmp_path), *CLI_OPTS)
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
    assert files(tmp_path) == ref
    r = json.loads((tmp_path / "big" / FOLDER[a] / "result.json").read_text())
    assert r["run"]["timings"]["base"]["resumed_units"] > 0


def test_merge_names_missing_units_then_builds(tmp_path, suite, zoo, singles, monkeypatch):
    from genshift.eval import merging

    a = ARCHS[2]
    # a 2-process sweep where only process 0 ran: half the units are missing
    fake_world(monkeypatch, 2, 0)
    jobs = sweep(tmp_path, suite, zoo, archs=(a,))
    assert jobs[0].result is None and (tmp_path / "toy" / FOLDER[a] / ".work").is_dir()
    with pytest.raises(BenchError, match=rf"units missing: toy/{FOLDER[a]}: config base: unit\(s\) "):
        merging.merge(tmp_path)
    monkeypatch.undo()
    sweep(tmp_path, suite, zoo, archs=(a,))  # the rerun (one process here) does the rest and builds the result
    assert files(tmp_path) == {k: v for k, v in files(singles).items() if FOLDER[a] in k}


@pytest.fixture(scope="module")
def split_run(tmp_path_factory, suite, zoo):
    """A finished 2-process sweep of one model whose result was not built yet: parts of both processes."""
    from genshift.eval import merging
    from genshift.eval import sweep as module

    out = tmp_path_factory.mktemp("split")
    a = ARCHS[2]
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(module, "finish_run", lambda *a, **kw: {})  # leave the parts for --merge
        # the processes one after the other: each splits what is left, so alternate until all is done
        for rank in (0, 1, 0, 1, 0, 1):
            fake_world(mp, 2, rank)
            sweep(out, suite, zoo, archs=(a,))
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
    assert files(out) == {k: v for k, v in files(singles).items() if FOLDER[a] in k}
    r = json.loads((out / "toy" / FOLDER[a] / "result.json").read_text())
    assert not r["flags"]["partial"] and r["counts"]["base"]["predicted"] == 18
    assert set(r["run"]["timings"]["base"]["units_by_rank"]) == {"0", "1"}
