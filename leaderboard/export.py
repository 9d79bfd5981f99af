"""The CSV and JSON downloads of a board view (``docs/leaderboard.md``, "Search and filters"): the page's units in
every header, rounded to :data:`DECIMALS` places, ranks as integers, plain RFC 8259 JSON (``null``, nothing escaped
that need not be). Text cells a spreadsheet would run as a formula get a leading apostrophe in the CSV (OWASP,
"CSV Injection"); numbers stay numbers and a lone ``-`` placeholder is not a formula.
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


def to_csv_bytes(view: pd.DataFrame) -> bytes:
    """The view in the page's units, every text cell defused (numbers and booleans untouched)."""
    safe = with_units(view)
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]) and not pd.api.types.is_bool_dtype(safe[col]):
            safe[col] = safe[col].map(defuse)
    return safe.to_csv(index=False).encode()


def to_json_bytes(view: pd.DataFrame) -> bytes:
    rows = with_units(view).astype(object).where(lambda d: d.notna(), None).to_dict(orient="records")
    return json.dumps(rows, indent=1, ensure_ascii=False, allow_nan=False, default=lambda v: v.item()).encode()
