"""What is installed: one import package, `genshift`, light to import, whatever a user's working folder holds."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheel_holds_only_genshift(tmp_path):
    src = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                             ".venv*", "runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("genshift_bench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"genshift"}, top
    assert "genshift/eval/runner.py" in names and "genshift/builders/__init__.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith(("benchmarks/", "tests/"))]


@pytest.mark.subprocess
def test_bench_and_import_work_beside_a_users_eval_benchmark_and_leaderboard(tmp_path):
    (tmp_path / "eval.py").write_text("raise SystemExit('the user eval.py was imported')\n")
    (tmp_path / "benchmark.py").write_text("raise SystemExit('the user benchmark.py was imported')\n")
    (tmp_path / "leaderboard").mkdir()
    (tmp_path / "leaderboard" / "__init__.py").write_text("raise SystemExit('the user leaderboard/ was imported')\n")
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "TQDM_DISABLE": "1"}
    probe = ("import sys, genshift; from genshift.eval import runner; from genshift.leaderboard import aggregate; "
             "print(genshift.__version__)")
    p = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    bench = str(Path(sys.executable).parent / "bench")
    for argv, shown in (([bench, "suites"], "imagenet-star"), ([sys.executable, "-m", "genshift", "eval", "--help"],
                                                                 "usage: bench eval")):
        p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and shown in p.stdout, p.stderr


@pytest.mark.subprocess
def test_import_genshift_is_light():
    """The API's names are imported on first use: `import genshift` loads neither torch nor timm."""
    probe = ("import sys, genshift; assert callable(genshift.__getattr__); "
             "heavy = [m for m in ('torch', 'timm', 'datasets') if m in sys.modules]; print(heavy); "
             "genshift.EvalOptions(topk=5); print(sorted(genshift.__all__))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    heavy, names = p.stdout.splitlines()
    assert heavy == "[]"
    assert names == str(sorted(["evaluate", "Result", "EvalOptions", "verify", "slope", "load_suite", "__version__"]))
