"""The server process of `bench leaderboard`: Streamlit's own command line (``streamlit run ...``), with
the app's modules imported and the store's loader opened (``leaderboard.index.preload``: the index's
head read and checked) in a background thread while Streamlit starts. A restarted board's first page
then finds them ready instead of paying for them in its first run (about 1 s here: pandas, pyarrow,
the store, index and aggregate modules, the head).

    python -m leaderboard.serve run leaderboard/app.py --server.port 8501 ...
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def _warm() -> None:
    try:
        from leaderboard import aggregate, export, reported  # noqa: F401  (the app's first run needs them all)
        from leaderboard.index import preload

        preload(os.environ.get("GENSHIFT_RESULTS", "runs"), os.environ.get("GENSHIFT_TRUSTED_KEYS") or None,
                os.environ.get("GENSHIFT_SUITES") or None)
    except Exception as e:  # noqa: BLE001 - the app opens the store itself and shows what is wrong
        log.debug("warm-up failed: %s", e)


def main(argv: list[str] | None = None) -> None:
    # the libraries Streamlit imports too, first and in this thread: some packages look a module up in
    # sys.modules (plotly: pandas) and would find it half-imported by the warm-up thread
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    from streamlit.web import cli

    threading.Thread(target=_warm, name="genshift-warm-up", daemon=True).start()

    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="streamlit")


if __name__ == "__main__":
    main()
