"""The CSV and JSON downloads of a board view: units in every header, safe to open in a spreadsheet.

Values are exported in the units the page shows, and every header says which: accuracies and
rates in percent (``acc@1/shift_01 (%)``), differences of two accuracies or probabilities in
percentage points (``model_mean_impact (pp)``), parameters in millions (``params (M)``); rounded to
:data:`DECIMALS` places (0.01 pp resolves one image in 10,000, finer than any suite's accuracy steps),
ranks as integers. The JSON is plain RFC 8259 JSON: missing values are ``null``, nothing escaped that
need not be (``/`` and non-ASCII stay as they are).

Model names and notes come from submitted results, so a text cell starting with ``=``, ``+``,
``-``, ``@``, tab or carriage return would run as a formula in Excel/LibreOffice/Sheets. Such
cells get a leading apostrophe in the CSV (OWASP, "CSV Injection"); numbers stay numbers, and the
placeholder ``-`` alone is not a formula. The page itself shows text as it is (the data grid's own
CSV export is switched off, ``client.disableDataExport``).
"""

from __future__ import annotations

import json

import pandas as pd

DECIMALS = {"%": 2, "pp": 2, "params (M)": 3}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _units() -> dict[str, str]:
    from genshift.families import FAMILIES

    out = {"base_acc1": "%", "effective_robustness": "pp", "shift_impact": "pp"}
    for name in FAMILIES:
        out.update({m.key: m.unit for m in FAMILIES.get(name).metrics})
    return out


UNITS = _units()  # column key -> unit, as the metric families declare them (genshift.families)


def unit(col: str) -> str:
    """The unit of a board column: ``"pp"`` for differences of two accuracies/probabilities, ``"%"`` for accuracies
    and rates (as its family declares the metric; ``<key>/<config>`` and ``<key>_lo``/``_hi`` too), else ""."""
    key = col.split("/", 1)[0]
    for suffix in ("_lo", "_hi", "_linear", "_probit"):
        key = key.removesuffix(suffix)
    return UNITS.get(key, "")


def with_units(view: pd.DataFrame) -> pd.DataFrame:
    """A copy in the page's units (fractions x 100), rounded (:data:`DECIMALS`), whose headers name them."""
    out = view.drop(columns=[c for c in ("ranked",) if c in view.columns])
    names = {"params_m": "params (M)"}
    for col in out.columns:
        u = unit(col)
        if u and pd.api.types.is_float_dtype(out[col]):
            out[col] = (out[col] * 100).round(DECIMALS[u])
            names[col] = f"{col.replace('acc1/', 'acc@1/').replace('acc5/', 'acc@5/')} ({u})"
    for col in ("rank", "rank_lo", "rank_hi"):
        if col in out.columns:
            out[col] = out[col].astype("Int64")
    if "params_m" in out.columns:
        out["params_m"] = out["params_m"].round(DECIMALS["params (M)"])
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
    rows = with_units(view).astype(object).where(lambda d: d.notna(), None).to_dict(orient="records")
    return json.dumps(rows, indent=1, ensure_ascii=False, allow_nan=False, default=lambda v: v.item()).encode()
