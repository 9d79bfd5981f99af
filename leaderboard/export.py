"""The CSV download of a board view, safe to open in a spreadsheet.

Model names and notes come from submitted results, so a text cell starting with ``=``, ``+``,
``-``, ``@``, tab or carriage return would run as a formula in Excel/LibreOffice/Sheets. Such
cells get a leading apostrophe (OWASP, "CSV Injection"); numbers stay numbers. The same applies
to every frame the app displays, since the grid's toolbar can export it as CSV.
"""

from __future__ import annotations

import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def defuse(value):
    """``value`` with a leading ``'`` if it is text a spreadsheet would evaluate."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def defuse_frame(view: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells are all defused (numbers and booleans untouched). The app shows only
    such frames, so the data grid's own "Download as CSV" is formula-safe as well."""
    safe = view.copy()
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]) and not pd.api.types.is_bool_dtype(safe[col]):
            safe[col] = safe[col].map(defuse)
    return safe


def to_csv_bytes(view: pd.DataFrame) -> bytes:
    return defuse_frame(view).to_csv(index=False).encode()
