"""The leaderboard's Streamlit script (``bench leaderboard`` serves it; the exported Space runs it): the
page is :func:`genshift.leaderboard.ui.main`.

Nothing is imported unless this file runs as the app. A worker process of the store check
(``genshift.leaderboard.check_pool``, multiprocessing "spawn") runs the parent's main script again as
``__mp_main__``, and under Streamlit that is this file: the worker must not import Streamlit, pandas
and the page there (about a second of CPU per worker while a never-seen board paints its first rows;
docs/performance.md), nor open a store and start a check of its own.
"""

if __name__ == "__main__":
    from genshift.leaderboard.serve import wait_warm

    wait_warm()  # under `bench leaderboard` its warm-up thread imports the page's modules: one importing thread
    from genshift.leaderboard.ui import main

    main()
