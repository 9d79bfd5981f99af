"""The CSV and JSON downloads of a board view: units in every header, safe to open in a spreadsheet.

Values are exported in the units the page shows, and every header says which: accuracies and
rates in percent (``acc@1/shift_01 (%)``), differences of two accuracies or probabilities in
percentage points (``model_mean_impact (pp)``), parameters in millions (``params (M)``).

Model names and notes come from submitted results, so a text cell starting with ``=``, ``+``,
``-``, ``@``, tab or carriage return would run as a formula in Excel/LibreOffice/Sheets. Such
cells get a leading apostrophe in the CSV (OWASP, "CSV Injection"); numbers stay numbers, and the
placeholder ``-`` alone is not a formula. The page itself shows text as it is (the data grid's own
CSV export is switched off, ``client.disableDataExport``).
"""

from __future__ import annotations

import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


PP_PREFIXES = ("impact/", "delta_p", "delta_acc", "model_mean_impact", "mean_delta_p", "effective_robustness")
PERCENT_PREFIXES = ("acc1/", "acc5/", "mean_acc1", "mean_shift_acc1", "top1_error", "top3_failure_rate",
                    "parent_failure_rate")


def unit(col: str) -> str:
    """``"pp"`` for differences of two accuracies/probabilities, ``"%"`` for accuracies and rates, else ""."""
    if col.startswith(PP_PREFIXES):
        return "pp"
    return "%" if col.startswith(PERCENT_PREFIXES) else ""


def with_units(view: pd.DataFrame) -> pd.DataFrame:
    """A copy in the page's units (fractions x 100) whose headers name them."""
    out = view.copy()
    names = {}
    for col in out.columns:
        u = unit(col)
        if u and pd.api.types.is_numeric_dtype(out[col]) and not pd.api.types.is_bool_dtype(out[col]):
            out[col] = out[col] * 100
            names[col] = f"{col.replace('acc1/', 'acc@1/').replace('acc5/', 'acc@5/')} ({u})"
    names["params_m"] = "params (M)"
    return out.rename(columns=names)


def defuse(value):
    """``value`` with a leading ``'`` if it is text a spreadsheet would evaluate (a lone ``-`` is not)."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and value.strip() != "-":
        return "'" + value
    return value


def defuse_frame(view: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells are all defused (numbers and booleans untouched). The app shows only
    such frames, so the data grid's own "Download as CSV" is formula-safe as well."""
    safe = view.copy()
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]) and not pd.api.types.is_bool_dtype(safe[col]):
            safe[col] = safe[col].map(defuse)
    return safe


def to_csv_bytes(view: pd.DataFrame) -> bytes:
    return defuse_frame(with_units(view)).to_csv(index=False).encode()


def to_json_bytes(view: pd.DataFrame) -> bytes:
    return with_units(view).to_json(orient="records", indent=1).encode()
