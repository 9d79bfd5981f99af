"""Sweeps under launchers: N processes each do their units and write the bytes of one process; a
launcher environment that cannot be read consistently is one line. Shared fixtures: tests/sweepkit.py."""

import json
import subprocess
import sys

import pytest

from genshift.cli import main
from tests.sweepkit import ARCHS, FOLDER, cli, files

LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # accelerate's multi-process launcher; with --device cpu the sweep asks accelerate for a CPU (gloo) group
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"],
    # accelerate's --cpu launcher starts ONE process (without an MPI host file): a world of one, all units rank 0
    "accelerate-cpu": ["-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                       "--mixed_precision", "no", "--dynamo_backend", "no"],
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_launched_processes_each_do_their_units_and_equal_one_process(tmp_path, suite, zoo, singles, launcher):
    models = tmp_path / "zoo.txt"
    models.write_text("".join(f"{a} {zoo[a]}\n" for a in ARCHS))
    env, cmd = cli("--models", str(models), "--suite", str(suite), "--out", str(tmp_path / "two"), "--workers", "0",
                   "--batch-size", "4", "--compile", "off", "--no-progress", "--device", "cpu", "--cpu-threads", "1")
    p = subprocess.run([sys.executable, *LAUNCHERS[launcher], "-m", "genshift", *cmd[3:]], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    # the bytes of one process at the same (recorded) thread count
    assert files(tmp_path / "two") == files(singles)
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
    ({"ACCELERATE_USE_CPU": "True", "DEVICE": "cuda"}, "launched with `accelerate launch --cpu` but device cuda"),
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
