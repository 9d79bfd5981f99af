"""`bench leaderboard`: serve the Streamlit leaderboard over a results store, or export it as a Space."""

from __future__ import annotations

from genshift.cli._common import add_verb
from genshift.errors import BenchError
from genshift.leaderboard import STREAMLIT

# the served page's Streamlit settings (the Space's, but for its hidden error details)
STREAMLIT_FLAGS = tuple(arg for section, opts in STREAMLIT.items() for k, v in opts.items() if k != "showErrorDetails"
                        for arg in (f"--{section}.{k}", v if isinstance(v, str) else str(v).lower()))


def add_parser(sub):
    p = add_verb(sub, "leaderboard", help="serve the Streamlit leaderboard (or export it as a Hugging Face Space)",
                 description="Serve the leaderboard app over a results store: a folder of `bench eval --out` runs or a "
                             "Hub dataset repo ORG/NAME[@sha] (pinned to a sha here), or export it as a Space.",
                 examples="  bench leaderboard --results runs\n"
                          "  bench leaderboard --results my-org/genshift-results@3f2a...c9 --trusted-keys trusted "
                          "--port 8600\n"
                          "  bench leaderboard --results my-org/genshift-results --trusted-keys trusted "
                          "--export-space space/\n")
    p.add_argument("--results", default="runs", help="results folder or ORG/NAME[@sha] (default: runs)")
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default: 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--trusted-keys", metavar="FILE",
                   help="maintainers' public keys (KEY.pub lines); only records signed by one count as verified")
    p.add_argument("--suites", metavar="DIR", help="trusted suite manifests (*.json) and/or suite folders: "
                                                  "entries made on other suite data are rejected")
    p.add_argument("--id-accuracy", metavar="FILE",
                   help="ImageNet-val top-1 per model for the ID/OOD x-axis: timm's results-imagenet.csv or any "
                        "CSV with columns model,top1 (percent)")
    p.add_argument("--hub-results", action="store_true",
                   help="also show the scores model repos report on the Hub, in a never-ranked table (docs/hub.md)")
    p.add_argument("--export-space", metavar="DIR",
                   help="write a deployable Hugging Face Space of this board (a Hub store pinned), then exit")
    return p


def port_free(host: str, port: int) -> bool:
    import socket

    try:  # as the server binds: SO_REUSEADDR on POSIX, so a just-stopped server's TIME_WAIT does not count
        socket.create_server((host, port)).close()
    except OSError:
        return False
    return True


def run(args) -> int:
    import importlib.util
    import os
    from pathlib import Path

    from genshift.hubio import is_repo_id, resolve_revision
    from genshift.leaderboard import Settings
    from genshift.leaderboard.aggregate import read_id_accuracy
    from genshift.leaderboard.store import resolve_source, trust

    if not 1 <= args.port <= 65535:
        raise BenchError(f"--port must be 1..65535, got {args.port}")
    # the page's Settings: each file checked now, as the page will read it; a Hub store pinned to its commit now
    trust(args.trusted_keys, [args.suites] if args.suites else None)
    if args.id_accuracy:
        read_id_accuracy(args.id_accuracy)
    results = args.results
    if Path(results).is_dir():
        results = os.path.abspath(results)
    else:
        repo, _, rev = results.partition("@")
        if not is_repo_id(repo):
            resolve_source(results)  # the one line saying what a store is
        results = f"{repo}@{resolve_revision(repo, rev or None)}"
    absolute = lambda p: os.path.abspath(p) if p else None  # noqa: E731
    settings = Settings(results=results, trusted_keys=absolute(args.trusted_keys), suites=absolute(args.suites),
                        id_accuracy=absolute(args.id_accuracy), hub_results=args.hub_results)
    if args.export_space:
        from genshift.leaderboard.space import export_space

        out = export_space(args.export_space, settings)
        print(f"Space for {settings.results} written to {out}; push it with:\n"
              f"  hf upload ORG/NAME {out} . --repo-type space")
        return 0
    if not port_free(args.host, args.port):
        raise BenchError(f"port {args.port} on {args.host} is in use; pass another --port")
    from streamlit.web import cli as streamlit_cli

    app = importlib.util.find_spec("genshift.leaderboard.app").origin
    print(f"leaderboard for {settings.results} on http://{args.host}:{args.port}", flush=True)
    # Streamlit's own `streamlit run`, in this process: it stops on SIGINT/SIGTERM as Streamlit does
    streamlit_cli.main(args=["run", app, "--server.port", str(args.port), "--server.address", args.host,
                             *STREAMLIT_FLAGS, "--", settings.dumps()], prog_name="streamlit")
    return 0
