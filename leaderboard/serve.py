"""The server process of `bench leaderboard`: Streamlit's own command line (``streamlit run ...``), with
the app's modules imported and the store's loader opened (``genshift.leaderboard.index.preload``: the index's
head read and checked) in a background thread. A restarted board's first page then finds them ready
instead of paying for them in its first run (about 1 s here: pandas, pyarrow, the store, index and
aggregate modules, the head).

The warm-up starts once Streamlit's server listens (or a page run began), not before: run while
Streamlit starts, it took the GIL from Streamlit's own start-up and delayed the server's first answer by
about 0.5 s here (docs/performance.md). It then runs while the browser loads the page. The page's first
run waits for its imports (:func:`wait_warm`), so the heavy modules are imported by one thread only
(some packages look a module up in ``sys.modules``, plotly for pandas, and would find one half-imported
by another thread), and for the loader it opens (``genshift.leaderboard.index.open_loader``), so the store is
never opened twice.

    python -m genshift.leaderboard.serve run leaderboard/app.py --server.port 8501 ...
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time

log = logging.getLogger(__name__)

LISTEN_WAIT_S = 30.0  # the warm-up starts anyway after this long without a listening server
WARM_WAIT_S = 60.0    # a page run goes on without the warm-up's imports after this long
_warming = threading.Event()   # set while a warm-up runs in this process
_page = threading.Event()      # set by the first page run: the server listens, whatever the poll saw
_imported = threading.Event()  # set once the warm-up's imports are done (or failed)


def wait_warm() -> bool:
    """Called by the app before its imports: wait for this process's warm-up to have imported the page's
    modules, if one runs (never under a plain ``streamlit run``, AppTest or a Space); the store's loader
    it opens next is waited for by ``genshift.leaderboard.index.open_loader``. Returns whether one was waited for."""
    if not _warming.is_set():
        return False
    _page.set()
    _imported.wait(WARM_WAIT_S)
    return True


def _option(args: list[str], name: str, default: str | None) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _warm(host: str, port: int | None) -> None:
    settings = (os.environ.get("GENSHIFT_RESULTS", "runs"), os.environ.get("GENSHIFT_TRUSTED_KEYS") or None,
                os.environ.get("GENSHIFT_SUITES") or None)
    announced = False
    try:
        from streamlit import config

        deadline = time.monotonic() + LISTEN_WAIT_S
        while not _page.is_set() and time.monotonic() < deadline and \
                not _listening(host, port or int(config.get_option("server.port"))):  # a port from config files too
            time.sleep(0.02)
        import pandas  # noqa: F401  (first: the modules below import it)
        import pyarrow  # noqa: F401

        from genshift.leaderboard import ui  # noqa: F401  (the page and every module its first run needs)
        from genshift.leaderboard.index import announce_preload

        announce_preload(*settings)
        announced = True
    except Exception as e:  # noqa: BLE001 - the app opens the store itself and shows what is wrong
        log.debug("warm-up failed: %s", e)
    finally:
        _imported.set()
    if announced:
        from genshift.leaderboard.index import preload

        try:
            preload(*settings)
        except Exception as e:  # noqa: BLE001 - the page's own loader shows what is wrong
            log.debug("preload failed: %s", e)


def main(argv: list[str] | None = None) -> None:
    from streamlit.web import cli

    args = list(sys.argv[1:] if argv is None else argv)
    host = _option(args, "--server.address", "127.0.0.1")
    port = _option(args, "--server.port", None)
    _warming.set()
    threading.Thread(target=_warm, args=({"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host),
                                         int(port) if port else None), name="genshift-warm-up", daemon=True).start()
    cli.main(args=args, prog_name="streamlit")


if __name__ == "__main__":
    from genshift.leaderboard.serve import main as _main  # the importable module, whose warm-up state the app reads

    _main()
