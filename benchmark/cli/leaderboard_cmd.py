"""`bench leaderboard`: serve the Streamlit leaderboard over a results store."""

from __future__ import annotations

from benchmark.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "leaderboard", help="serve the Streamlit leaderboard",
                 description="Serve the leaderboard app over a results store: a folder of `bench eval --out` runs, or "
                             "a Hub dataset repo ORG/NAME[@sha] of results (pin a sha for a reproducible board).",
                 examples="  bench leaderboard --results runs\n"
                          "  bench leaderboard --results my-org/genshift-results@3f2a...c9 --port 8600\n")
    p.add_argument("--results", default="runs", help="results folder or ORG/NAME[@sha] (default: runs)")
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default: 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    return p


def port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def run(args) -> int:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from benchmark.errors import BenchError
    from leaderboard.store import resolve_source

    if not 1 <= args.port <= 65535:
        raise BenchError(f"--port must be 1..65535, got {args.port}")
    root, revision = resolve_source(args.results)  # checks the store exists (or downloads it) first
    if not port_free(args.host, args.port):
        raise BenchError(f"port {args.port} on {args.host} is in use; pass another --port")
    import importlib.util

    app = Path(importlib.util.find_spec("leaderboard").origin).parent / "app.py"
    source = str(root) if revision is None else f"{args.results.partition('@')[0]}@{revision}"
    env = {**os.environ, "GENSHIFT_RESULTS": source}
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(args.port),
           "--server.address", args.host, "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"leaderboard for {source} on http://{args.host}:{args.port}", flush=True)
    return subprocess.call(cmd, env=env)
