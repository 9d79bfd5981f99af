"""``bench leaderboard``'s Streamlit script, ``streamlit run app.py -- '<Settings JSON>'``: :func:`ui.main`."""

import sys

from genshift.leaderboard import Settings
from genshift.leaderboard.ui import main

main(Settings.loads(sys.argv[1]) if len(sys.argv) > 1 else Settings())
