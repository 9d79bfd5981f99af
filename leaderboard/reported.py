"""The papers' reported per-model numbers as a board table of their own, "Reported in the paper": never verified,
never ranked (``docs/leaderboard.md``, "What the app shows"; package data ``benchmark/_data/reported.yaml``).
"""

from __future__ import annotations

import pandas as pd

from genshift.suites import get_population

HEADING = "Reported in the paper"
NOTE = ("Numbers as printed in the papers (source per row): not recomputed, not verified and not ranked. Our own "
        "re-runs of these models are in the ranked table; `bench reproduce` prints both side by side.")
_METRIC_NAMES = {"acc1": "acc@1 %", "acc5": "acc@5 %", "top3_failure_rate": "top-3 failure rate %"}


def reported_frame(suite: str | None = None) -> pd.DataFrame:
    """One row per reported number: paper, where, row, model (the paper's name), timm tag (our
    population's choice, empty where the paper's model is not a timm classifier), metric, value."""
    from genshift.eval.reproduce import reported

    rows = []
    for rep in reported().values():
        if suite is not None and suite not in rep["suites"]:
            continue
        members = get_population(rep["population"]).members
        tags = {m.paper: m.model + (" (own checkpoint)" if m.local else "") for m in members}
        source = {"paper": rep["paper"], "where": rep["where"]}
        for r in rep["rows"]:
            if "values" in r:  # a table: the paper's row x model columns
                rows += [{"suite": rep["suites"][0], "row": r["row"], "model": model, "timm": tags.get(model, ""),
                          "metric": _METRIC_NAMES[metric], "reported": f"{v:.2f}", **source}
                         for model, values in r["values"].items() for metric, v in zip(rep["metrics"], values)]
            else:  # a number or range stated in the text for one model or a group
                group = [m.paper for m in members if r["row"] in (m.paper, m.role)]
                value = f"{r['value']:.0f}" if "value" in r else f"{r['range'][0]}-{r['range'][1]}"
                rows.append({"suite": r["suite"], "row": r["text"], "model": ", ".join(group),
                             "timm": ", ".join(tags[m] for m in group), "metric": _METRIC_NAMES[rep["metrics"][0]],
                             "reported": value, **source})
    frame = pd.DataFrame(rows, columns=["suite", "row", "model", "timm", "metric", "reported", "paper", "where"])
    return frame if suite is None else frame[frame["suite"] == suite].reset_index(drop=True)


def show(st, suite: str | None = None) -> None:
    """The "Reported in the paper" section for one suite (all suites when ``suite`` is None)."""
    frame = reported_frame(suite)
    if frame.empty:
        return
    st.subheader(HEADING)
    st.caption(NOTE)
    st.dataframe(frame, hide_index=True, key=f"reported-{suite or 'all'}")
