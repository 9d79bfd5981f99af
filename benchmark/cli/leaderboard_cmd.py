"""`bench leaderboard`: serve the Streamlit leaderboard over a results store, or export it as a Space."""

from __future__ import annotations

from genshift.cli._common import add_verb

# viewer mode: no developer menu, no Deploy button, no grid CSV export (the app offers formula-safe
# downloads of its own); the same settings the exported Space ships in .streamlit/config.toml
STREAMLIT_FLAGS = ("--server.headless", "true", "--browser.gatherUsageStats", "false", "--client.toolbarMode",
                   "viewer", "--client.disableDataExport", "true", "--server.runOnSave", "false")


def add_parser(sub):
    p = add_verb(sub, "leaderboard", help="serve the Streamlit leaderboard (or export it as a Hugging Face Space)",
                 description="Serve the leaderboard app over a results store: a folder of `bench eval --out` runs, or "
                             "a Hub dataset repo ORG/NAME[@sha] of results (pin a sha for a reproducible board). "
                             "With --export-space, write a deployable Streamlit Space instead.",
                 examples="  bench leaderboard --results runs\n"
                          "  bench leaderboard --results my-org/genshift-results@3f2a...c9 --trusted-keys trusted "
                          "--port 8600\n"
                          "  bench leaderboard --results my-org/genshift-results --trusted-keys trusted "
                          "--export-space space/\n")
    p.add_argument("--results", default="runs", help="results folder or ORG/NAME[@sha] (default: runs)")
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default: 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--trusted-keys", metavar="FILE",
                   help="maintainers' public keys (KEY.pub lines); only stamps signed by one count as verified")
    p.add_argument("--suites", metavar="DIR",
                   help="trusted suite manifests (*.json) and/or suite folders: every entry is checked against its "
                        "suite's manifest (rows digest, counts) and entries on other suite data are rejected "
                        "(default: the registry's manifests in the local Hub cache; entries of other suites are "
                        "shown as not checked against their suite)")
    p.add_argument("--id-accuracy", metavar="FILE",
                   help="ImageNet-val top-1 per model for the ID/OOD x-axis: timm's results-imagenet.csv or any "
                        "CSV with columns model,top1 (percent)")
    p.add_argument("--hub-results", action="store_true",
                   help="also show the scores model repos report on the Hub for each suite's dataset (its Hub "
                        "leaderboard) in a separate, never-ranked 'Reported on the Hub' table (docs/hub.md)")
    p.add_argument("--export-space", metavar="DIR",
                   help="write a deployable Hugging Face Space (Streamlit) for --results ORG/NAME pinned to its "
                        "current commit, then exit")
    return p


def port_free(host: str, port: int) -> bool:
    import os
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if os.name == "posix":  # as the server binds: a just-stopped server's TIME_WAIT connections do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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

    from genshift.errors import BenchError

    if not 1 <= args.port <= 65535:
        raise BenchError(f"--port must be 1..65535, got {args.port}")
    if args.trusted_keys:
        from genshift.eval.stamps import load_trusted_keys

        load_trusted_keys(args.trusted_keys)  # a bad file is one error line now, not a broken board later
    if args.id_accuracy:
        from genshift.leaderboard.aggregate import read_id_accuracy

        read_id_accuracy(args.id_accuracy)
    if args.suites:
        from genshift.eval.suite_trust import TrustedSuites

        TrustedSuites.from_paths([args.suites], registry=False)  # a bad folder is one error line now
    if args.export_space:
        from genshift.leaderboard.space import export_space

        if Path(args.results).exists():
            raise BenchError("--export-space needs --results ORG/NAME[@sha] of a Hub dataset repo (a Space cannot "
                             "read a local folder); push the results first")
        from genshift.hub import resolve_revision

        repo, _, rev = args.results.partition("@")
        sha = resolve_revision(repo, rev or None)
        out = export_space(args.export_space, results=repo, revision=sha, trusted_keys=args.trusted_keys,
                           id_accuracy=args.id_accuracy, suites=args.suites)
        print(f"Space for {repo}@{sha} written to {out}; push it with: "
              f"huggingface-cli upload --repo-type space ORG/NAME {out} .")
        return 0
    if Path(args.results).is_dir():  # a local store: no need to import the store module (~0.4 s) before serving
        root, revision = Path(args.results), None
    else:
        from genshift.leaderboard.store import resolve_source

        root, revision = resolve_source(args.results)  # checks the store exists (or downloads it) first
    if not port_free(args.host, args.port):
        raise BenchError(f"port {args.port} on {args.host} is in use; pass another --port")
    import importlib.util

    app = Path(importlib.util.find_spec("genshift.leaderboard").origin).parent / "app.py"
    source = str(root) if revision is None else f"{args.results.partition('@')[0]}@{revision}"
    env = {**os.environ, "GENSHIFT_RESULTS": source}
    env.pop("GENSHIFT_HUB_RESULTS", None)
    if args.hub_results:
        env["GENSHIFT_HUB_RESULTS"] = "1"
    for name, value in (("GENSHIFT_TRUSTED_KEYS", args.trusted_keys), ("GENSHIFT_ID_ACCURACY", args.id_accuracy),
                        ("GENSHIFT_SUITES", args.suites)):
        if value:
            env[name] = os.path.abspath(value)
        else:
            env.pop(name, None)
    # streamlit's command line; the app's imports and the index's head are read once it listens (genshift.leaderboard.serve)
    cmd = [sys.executable, "-m", "genshift.leaderboard.serve", "run", str(app), "--server.port", str(args.port),
           "--server.address", args.host, *STREAMLIT_FLAGS]
    print(f"leaderboard for {source} on http://{args.host}:{args.port}", flush=True)
    return serve(cmd, env)


STOP_GRACE_S = 10.0


def serve(cmd: list[str], env: dict) -> int:
    """Run the Streamlit server as a child and stop it with us: SIGTERM, SIGINT or SIGHUP to `bench
    leaderboard` is passed on as SIGTERM (killed after STOP_GRACE_S), so no orphaned server keeps the
    port; returns the server's exit status, or 128 + the signal number when stopped by one."""
    import signal
    import subprocess
    import sys

    from genshift.leaderboard.check_pool import die_with_parent

    linux = sys.platform.startswith("linux")
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent if linux else None)
    stopped: list[int] = []

    class Stop(Exception):
        pass

    def stop(signum, _frame):
        if not stopped:  # a second signal while stopping changes nothing
            stopped.append(signum)
            proc.send_signal(signal.SIGTERM)
            raise Stop

    signals = [getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n)]
    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        try:
            rc = proc.wait()
        except Stop:
            try:
                rc = proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:  # any other way out of this process: never leave the server behind
            proc.kill()
            proc.wait()
    return 128 + stopped[0] if stopped else rc
