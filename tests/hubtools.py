"""Local Hub stand-ins for tests: olah (read-only, serving local git repos) and helpers.

olah 0.5.4 in offline mode serves ``<root>/{datasets,models}/<org>/<name>`` git repos as Hub
repos (``docs/hub.md`` s8); git commit shas are the Hub revisions.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

GIT = ["git", "-c", "user.email=tests@genshift", "-c", "user.name=tests", "-c", "commit.gpgsign=false"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git_commit(repo: Path, message: str) -> str:
    """Commit everything in ``repo`` (initialising it on first use); return the commit sha."""
    if not (repo / ".git").exists():
        subprocess.run(GIT + ["init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(GIT + ["-C", str(repo), "add", "-A"], check=True)
    subprocess.run(GIT + ["-C", str(repo), "commit", "-q", "--allow-empty", "-m", message], check=True)
    return subprocess.run(GIT + ["-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def olah_available() -> bool:
    return shutil.which("olah-cli") is not None or (Path(sys.executable).parent / "olah-cli").exists()


@contextlib.contextmanager
def olah_server(repos_root: Path, work: Path):
    """Run olah offline on a free port over ``repos_root``; yield its endpoint URL."""
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "olah.toml"
    cfg.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'mirror-netloc = "127.0.0.1:{port}"\nmirror-lfs-netloc = "127.0.0.1:{port}"\n'
        f'repos-path = "{work / "cache"}"\nmirrors-path = ["{repos_root}"]\n'
        "[accessibility]\noffline = true\n"
    )
    exe = shutil.which("olah-cli") or str(Path(sys.executable).parent / "olah-cli")
    log = open(work / "olah.log", "w")
    proc = subprocess.Popen([exe, "-c", str(cfg)], cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"olah exited early: {(work / 'olah.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("olah did not start within 60 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def bench_subprocess(args: list[str], env: dict, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``python -m genshift ...`` with its own environment (HF_* variables are read at import)."""
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "genshift", *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
