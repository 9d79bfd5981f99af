"""The genshift-bench leaderboard's page (Streamlit), run by the script ``leaderboard/app.py``.

Launched by ``bench leaderboard [--results DIR|ORG/NAME[@sha]]``, which passes the store in the
``GENSHIFT_RESULTS`` environment variable (``GENSHIFT_TRUSTED_KEYS``: the trusted keys file;
``GENSHIFT_ID_ACCURACY``: a CSV of ImageNet-val top-1 per model; ``GENSHIFT_SUITES``: a folder of
trusted suite manifests). Everything shown comes from
``genshift.leaderboard.store`` (checked in the background by ``genshift.leaderboard.index``) and
``genshift.leaderboard.aggregate``.

Text from results and stores (model ids, suite ids, config names, notes, stamp fields, reasons)
is never rendered as Markdown or HTML: it goes into dataframe cells, ``st.text``, widget options
and escaped plot labels only; in the CSV download, text cells a spreadsheet would evaluate get a
leading apostrophe. Every view is in the URL (widgets bound to query parameters), so a shared
link restores it.

What is ranked (``aggregate.not_ranked_because``): only verified, complete entries, among
themselves; everything else is listed, with its numbers and flags but no rank, in the community
table. Before drawing, the app re-checks every entry whose files changed on disk
(``Loader.refresh``), so badges and numbers always belong to the files as they are.
"""

from __future__ import annotations

import base64
import io
import os
import re
import time

import numpy as np
import pandas as pd
import streamlit as st

from genshift.errors import IntegrityError
from genshift.leaderboard import aggregate, reported
from genshift.leaderboard.about import ABOUT
from genshift.leaderboard.export import to_csv_bytes, to_json_bytes, unit
from genshift.leaderboard.index import Loader, open_loader, view_frame
from genshift.leaderboard.store import STAMP, Store

SAFE_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
FIRST_PAINT_WAIT_S = 1.0   # a small store is painted complete; a large one shows progress and first rows
AFTER_PAINT_S = 1.0        # a browser's first page: the tabs follow the table after at least this long
TABS = ["Shift heatmap", "ID/OOD", "Model drilldown", "Rejected", "About"]
PP = "%.2f pp"             # differences of accuracies/probabilities are percentage points
# viewers get no "Stop" button while a run is in progress (the toolbar's developer options are off in
# viewer mode, see `bench leaderboard`); a fixed style sheet, no data in it
VIEWER_CSS = "<style>[data-testid='stStatusWidget'] button {display: none}</style>"


def _signature(source: str) -> str:
    """Content key for the loader: sizes and mtimes of every entry's result and stamp (``<suite>/<run>/``,
    where ``load_store`` finds entries), or the Hub source. A change
    starts a new background check (painted meanwhile from the index of unchanged entries). Runs on every
    repaint: two levels of directories are listed, never the entries' own folders."""
    root = os.path.abspath(source)
    if not os.path.isdir(root):
        return source
    parts = []
    for suite in _subdirs(root):
        for run in _subdirs(suite):
            for f in ("result.json", STAMP):
                try:
                    st_ = os.stat(os.path.join(run, f))
                except OSError:
                    continue
                parts.append(f"{run}/{f}:{st_.st_size}:{st_.st_mtime_ns}")
    return "|".join(sorted(parts))


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return [e.path for e in it if e.is_dir()]
    except OSError:
        return []


@st.cache_resource(show_spinner=False, max_entries=4)
def get_loader(source: str, trusted_keys: str | None, suites: str | None, signature: str) -> Loader:
    return open_loader(source, trusted_keys, suites)  # the one `bench leaderboard` opened while starting, if any


@st.cache_data(show_spinner=False, max_entries=8)
def get_id_accuracy(path: str, mtime: float) -> dict[str, float]:
    return aggregate.read_id_accuracy(path)


@st.cache_data(show_spinner="Ranking with the paired bootstrap ...", max_entries=32)
def get_board(_store: Store, fingerprint: str, suite: str, board: str, intervals: bool) -> tuple[pd.DataFrame, dict]:
    return aggregate.board_table(_store.for_suite(suite, board), intervals=intervals)


@st.cache_data(show_spinner=False, max_entries=32)
def get_fits(_store: Store, fingerprint: str, suite: str, board: str, models: tuple[str, ...],
             id_accuracy: tuple | None) -> dict | None:
    entries = [e for e in _store.for_suite(suite, board) if e.model_id in set(models)]
    return aggregate.slope_fits(entries, id_accuracy=dict(id_accuracy) if id_accuracy is not None else None)


def plot_label(text) -> str:
    """Plot tick/hover labels: plotly interprets a few HTML tags in strings, so neutralise them."""
    return str(text).replace("&", "＆").replace("<", "‹").replace(">", "›")


def safe_filename(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:80] or "board"


def is_pp(col: str) -> bool:
    """Columns that are differences of two accuracies or probabilities: percentage points, not percent."""
    return unit(col) == "pp"


def from_url(key: str, options=None, *, multi: bool = False, parse=None, final: bool | None = None) -> None:
    """Restore a widget's value from the URL the session was opened with.

    Widgets are bound to query parameters (``bind="query-params"``), but Streamlit reads a bound
    parameter only when the session starts: a widget drawn later (after the background check, in
    a tab, once its options exist) would lose it. So the opening URL is kept and applied when
    the widget is first drawn with a valid value; while the board is still partial (``final``
    False) an unknown value waits for more entries instead of being dropped."""
    url = st.session_state.get("_url", {})
    if key not in url:
        return
    if final is None:  # default: whether this run shows the whole board (not a partial check)
        final = st.session_state.get("_board_final", True)
    try:
        value = parse(url[key]) if parse else (list(url[key]) if multi else url[key][-1])
    except (ValueError, TypeError, IndexError):
        value = None
    ok = value is not None and (options is None or (set(value) <= set(options) if multi else value in options))
    if ok:
        st.session_state[key] = value
    if ok or final:
        del url[key]


def binding(key: str) -> str | None:
    """Bind a widget to its query parameter, except while the opening URL's value for it is still pending
    (a cold board has not checked the entry it names yet): a bound widget would rewrite the address bar
    with its default and the shared link would lose that selection."""
    return None if key in st.session_state.get("_url", {}) else "query-params"


def _bool(values: list[str]) -> bool:
    if values[-1].lower() not in ("true", "false"):
        raise ValueError(values[-1])
    return values[-1].lower() == "true"


def _range(values: list[str], top: float) -> tuple[float, float]:
    lo, hi = (float(v) for v in values[-2:])
    if not 0.0 <= lo <= hi <= top:
        raise ValueError("out of range")
    return lo, hi


def show_df(df: pd.DataFrame, **kw) -> None:
    """Every dataframe goes through here: data-derived text stays text (a cell, never Markdown), shown as
    it is (the grid's own CSV export is off; the app's CSV download defuses formulas)."""
    st.dataframe(df, hide_index=True, **kw)


def guarded(title: str):
    """One view that fails to draw shows why, and the rest of the board stays up."""
    def wrap(fn):
        def inner(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as e:  # noqa: BLE001 - a view's failure must not take the board down
                if type(e).__name__ in ("StopException", "RerunException"):
                    raise
                st.error(f"The {title} view could not be drawn for this selection.")
                st.text(f"{type(e).__name__}: {e}")
        return inner
    return wrap


@st.fragment(run_every=1.0)
def progress_panel(loader: Loader, painted_version: int, empty: bool = False) -> None:
    """The background check's progress; repaints the board when more entries are checked (at once when the
    page shows no table yet, else at most every 2 s: each repaint takes CPU from the check)."""
    _, s = loader.snapshot()
    if s["version"] != painted_version and (s["finished"] or empty or
                                            time.monotonic() - st.session_state.get("_painted_at", 0) > 2.0):
        st.rerun(scope="app")
    if s["finished"]:
        return
    frac = s["done"] / s["total"] if s["total"] else 0.0
    what = {"head": "the table shows the last checked state; the rest of the board follows",
            "index": "the table shows the last checked state",
            "partial": "the table shows the results checked so far"}.get(s["kind"], "nothing checked yet")
    st.progress(frac, text=f"Checking results in the background: {s['done']} of {s['total'] or '?'} ({what}).")


@st.fragment(run_every=0.3)
def _after_first_paint() -> None:
    """Inline in a full run it arms; a later run on its own is the browser's timer tick, which fires only
    when the page's main thread is free: the board is drawn then, and at least AFTER_PAINT_S after the
    table was sent (the grid's script loads asynchronously, so a free main thread alone does not mean the
    table is painted; the tabs' run would take the CPU the browser paints with)."""
    if st.session_state.get("_first_paint_armed") == st.session_state["_full_runs"]:  # no full run since
        if time.monotonic() - st.session_state.get("_table_sent_at", 0.0) < AFTER_PAINT_S:
            return
        st.session_state["_first_painted"] = True
        st.rerun(scope="app")
    st.session_state["_first_paint_armed"] = st.session_state["_full_runs"]


def _table_first() -> bool:
    """Whether this run stops after the ranking table: a browser session's runs until its first paint.
    Drawing the charts in the same run makes the browser load and run plotly before it paints the
    table's grid (seconds at 500 models, docs/performance.md). A session without HTTP headers is no
    browser (Streamlit's AppTest, scripted clients): it gets the whole board in one run."""
    if st.session_state.get("_first_painted") or not st.context.headers:
        return False
    st.session_state["_full_runs"] = st.session_state.get("_full_runs", 0) + 1
    st.session_state["_table_sent_at"] = time.monotonic()
    _after_first_paint()
    return True


def main() -> None:
    """One run of the page (``leaderboard/app.py`` calls it on every Streamlit run)."""
    st.set_page_config(page_title="genshift-bench leaderboard", layout="wide")
    source = os.environ.get("GENSHIFT_RESULTS", "runs")
    keys = os.environ.get("GENSHIFT_TRUSTED_KEYS") or None
    suites = os.environ.get("GENSHIFT_SUITES") or None
    if "_url" not in st.session_state:  # the URL this session was opened with (see from_url)
        st.session_state["_url"] = {k: st.query_params.get_all(k) for k in st.query_params}
    st.html(VIEWER_CSS)
    st.title("genshift-bench leaderboard")
    try:
        loader = get_loader(source, keys, suites, _signature(source))
    except Exception as e:  # noqa: BLE001 - the app must show the problem, not a traceback
        st.error("Could not open the results store.")
        st.text(f"{type(e).__name__}: {e}")
        st.stop()
    if not st.context.headers:  # no browser (AppTest, scripted clients): the whole board in one run
        loader.want_store(wait=60)
    loader.wait_first_paint(FIRST_PAINT_WAIT_S)
    loader.refresh()  # entries whose files changed on disk are checked again before anything is drawn
    store, state = loader.snapshot()
    # a restarted server's first page: painted from the index's head, before the rest of the index is read
    first = loader.first_view() if store is None else None
    st.session_state["_painted_at"] = time.monotonic()
    if not state["finished"]:
        progress_panel(loader, state["version"], store is None and first is None)
    if state["error"] and store is None:
        st.error("Could not open the results store.")
        st.text(state["error"])
        st.stop()
    if store is None and first is None:
        st.stop()
    counts = first["counts"] if first is not None else {
        "results": len(store.entries), "verified": sum(e.verified for e in store.entries),
        "rejected": len(store.rejected), "superseded": len(store.superseded)}
    st.caption("Robustness of ImageNet classifiers to generated distribution shifts. All numbers recompute from "
               "stored per-image predictions (bench verify). Only verified, complete entries are ranked (see About).")
    st.text(f"results store: {loader.source}" + (f" @ {loader.revision}" if loader.revision and loader.revision not in
                                                  loader.source else "") +
            f" | {counts['results']} results ({counts['verified']} verified), "
            f"{counts['rejected']} rejected, {counts['superseded']} superseded"
            + (f" | trusted keys: {os.path.basename(keys)}" if keys else ""))
    if store is not None and not store.entries:
        if state["finished"]:
            st.info("No results yet. Score a model with `bench eval --model <timm name> --suite <suite> --out "
                    "<store>` or open a pull request with `bench submit`.")
            reported.show(st)
        _rejected(store, [])
        st.stop()

    final = state["kind"] != "partial"
    st.session_state["_board_final"] = final
    suites = first["suites"] if first is not None else store.suites()  # most verified entries first: the default
    from_url("suite", suites, final=final)
    suite = st.sidebar.selectbox("Suite", suites, key="suite", bind=binding("suite"))
    if first is not None and suite != first["suite"]:  # the first view holds the default suite's board only
        loader.want_store()
        st.stop()
    boards = first["boards"] if first is not None else store.boards(suite)
    board = boards[0]
    if len(boards) > 1:  # results on other suite revisions / protocols are never mixed into one table
        from_url("board", boards, final=final)
        board = st.sidebar.selectbox("Board (manifest sha256 - protocol sha256)", boards, key="board",
                                     bind=binding("board"))
        per_board = first["board_counts"] if first is not None else {
            b: [len(es := store.for_suite(suite, b)), sum(e.verified for e in es)] for b in boards}
        st.sidebar.text("\n".join(f"{b}: {per_board[b][0]} models, {per_board[b][1]} verified" for b in boards) +
                        "\nResults on other suite revisions or\nprotocols are not comparable and\nare shown on "
                        "their own boards.")
    if first is not None and board != first["board"]:
        loader.want_store()
        st.stop()
    # ranks are computed once over the board's ranked entries (point ranks while a cold board is checked)
    try:
        board_df, meta = (view_frame(first), first["meta"]) if first is not None else \
            get_board(store, store.fingerprint, suite, board, final)
    except IntegrityError as e:  # an entry's files changed after this run's refresh: check them again, draw anew
        if loader.refresh() is not store:
            st.rerun()
        st.error("An entry's files changed while the board was drawn.")
        st.text(str(e))  # names from the store: text, never Markdown
        st.stop()
    skipped = meta["skipped"]
    family_kind, metric, higher, metric_label = meta["family"], meta["metric"], meta["higher"], meta["metric_label"]
    configs = meta["configs"]

    families = sorted(board_df["family"].unique())
    pretrain = sorted(board_df["pretraining"].unique())
    from_url("family", families, multi=True, final=final)
    fam_sel = st.sidebar.multiselect("Architecture family", families, key="family", bind=binding("family"))
    from_url("pretraining", pretrain, multi=True, final=final)
    pre_sel = st.sidebar.multiselect("Pretraining data", pretrain, key="pretraining", bind=binding("pretraining"))
    pmax = max(float(np.ceil(board_df["params_m"].max() + 1e-9)), 1.0)
    from_url("params", parse=lambda v: _range(v, pmax), final=final)
    # the full range grows while a cold board is checked: an untouched full-range slider follows it
    prev = st.session_state.get("_pmax")
    if prev is not None and prev != pmax and tuple(st.session_state.get("params", ())) == (0.0, prev):
        st.session_state["params"] = (0.0, pmax)
    st.session_state["_pmax"] = pmax
    params = st.sidebar.slider("Parameters (M)", 0.0, pmax, key="params", bind=binding("params"),
                               **({} if "params" in st.session_state else {"value": (0.0, pmax)}))
    from_url("verified", parse=_bool)
    verified_only = st.sidebar.checkbox("Verified only (hide the community entries)", key="verified",
                                        bind=binding("verified"))
    from_url("construction", parse=_bool)
    construction = st.sidebar.checkbox("Show construction models (biased by construction, never ranked)",
                                       key="construction", bind=binding("construction"))

    # ranks were computed once over the board's ranked entries: filters select rows, never re-rank
    view = board_df[(board_df["params_m"] >= params[0]) & (board_df["params_m"] <= params[1])]
    if fam_sel:
        view = view[view["family"].isin(fam_sel)]
    if pre_sel:
        view = view[view["pretraining"].isin(pre_sel)]
    if verified_only:
        view = view[view["verified"]]
    if not construction:
        view = view[~view["construction_model"]]
    view = view.reset_index(drop=True)
    view["hub"] = [f"https://huggingface.co/{m}" if SAFE_REPO.match(m) else "" for m in view["model"]]
    official, community = view[view["ranked"]].reset_index(drop=True), view[~view["ranked"]].reset_index(drop=True)
    n_ranked = int(board_df["ranked"].sum())

    st.subheader("Official ranking (verified, complete entries)")
    st.text(f"suite {suite}, ranked by {metric_label}" + (" (lower is better)" if not higher else ""))
    if not final:
        st.text(f"ranking the {state['done']} of {state['total'] or '?'} entries checked so far: ranks may change "
                "until the check is complete (point ranks; intervals follow).")
    if n_ranked == 0:
        st.info("No verified, complete entry on this board yet, so nothing is ranked. The entries below are "
                "community entries: not verified, not ranked.")
    else:
        shown = f"; {len(official)} shown after the filters" if len(official) != n_ranked else ""
        st.caption(f"Ranks are among the {n_ranked} verified, complete entries of this board{shown}. Filters hide "
                   "rows and never re-rank; tied models share a rank. Rank and metric intervals are 95% "
                   "paired-bootstrap intervals over images, computed over the same ranked entries. Accuracies and "
                   "rates are in percent; differences (impact, Δ) in percentage points (pp).")
        _table(official, metric, metric_label, configs, key="main_table", ranked=True)
    if not verified_only and len(community):
        st.subheader("Community entries (not verified, not ranked)")
        st.caption("Unverified, partial or stale entries, and construction models: their numbers recompute from "
                   "their predictions, but no maintainer has re-run their images, so they hold no rank.")
        _table(community, metric, metric_label, configs, key="community_table", ranked=False)
    c1, c2 = st.columns(2)
    export = view.drop(columns=[c for c in ("hub",) if c in view.columns])
    # the files are made when clicked, not on every run (a 500-model CSV and JSON cost a first paint ~0.2 s)
    c1.download_button("Download CSV", lambda: to_csv_bytes(export), file_name=f"{safe_filename(suite)}-leaderboard.csv",
                       mime="text/csv", key="download_csv")
    c2.download_button("Download JSON", lambda: to_json_bytes(export),
                       file_name=f"{safe_filename(suite)}-leaderboard.json", mime="application/json", key="download_json")
    # a plain-text rendering of the top rows (accessible, and readable without the canvas grid)
    with st.expander("Top 10 as text"):
        lines = []
        for row in official.head(10).itertuples():
            value = getattr(row, metric)
            lines.append(f"{int(row.rank):>3}  {row.model}  " + ("-" if pd.isna(value) else f"{100 * value:.2f}"))
        st.text("\n".join(lines) or "nothing is ranked on this board")
    reported.show(st, suite)
    if store is not None and os.environ.get("GENSHIFT_HUB_RESULTS"):  # --hub-results: the Hub's side, never ranked
        from genshift.leaderboard.hub_results import show_hub_reported

        show_hub_reported(store.for_suite(suite, board), endpoint=os.environ.get("HF_ENDPOINT") or None)

    if first is not None:  # the first view: the tabs need the whole store, read once this page has rendered
        if not _table_first():
            loader.want_store()
        st.stop()
    if not final:  # a board still being checked: charts of a partial board would mislead, and cost its repaints
        st.caption("The charts, the model drilldown and the rejected entries follow when the check is complete.")
        st.stop()
    if _table_first():
        st.stop()
    from_url("tab", TABS)
    tabs = st.tabs(TABS, key="tab", bind=binding("tab"))
    with tabs[0]:
        _heatmap(pd.concat([official, community], ignore_index=True), configs)
    with tabs[1]:
        _id_ood(store, suite, board, view, family_kind)
    with tabs[2]:
        _drilldown(store, suite, board, view, configs)
    with tabs[3]:
        _rejected(store, skipped)
    with tabs[4]:
        _about()


def _table(view: pd.DataFrame, metric: str, metric_label: str, configs: list[str], *, key: str,
           ranked: bool) -> None:
    num = st.column_config.NumberColumn
    pct = lambda label: num(label, format="percent")  # noqa: E731
    pp = lambda label: num(label, format=PP)          # noqa: E731
    check = st.column_config.CheckboxColumn
    shown = view.copy()
    secondary = [c for c in ("model_mean_impact", "mean_delta_p", "parent_failure_rate", "top1_error")
                 if c in shown.columns and c != metric]
    shift_cols = [c for c in shown.columns if c.startswith("acc1/")]
    # trust columns right after rank / model / headline: in the first screen
    head = (["rank", "model", metric] if ranked else ["model", metric, "not_ranked_because"])
    cols = (head + ["verified", "partial", "pinned_suite", "flags"]
            + (["rank_lo", "rank_hi"] if ranked else []) + [f"{metric}_lo", f"{metric}_hi"] + secondary + shift_cols
            + ["family", "params_m", "pretraining", "construction_model", "hub"])
    for c in cols:
        if is_pp(c) and c in shown.columns:
            shown[c] = shown[c] * 100  # fractions -> percentage points for display
    fmt = pp if is_pp(metric) else pct
    column_config = {
        "rank": num("rank", format="%d", pinned=True),
        "rank_lo": num("rank lo", format="%d"), "rank_hi": num("rank hi", format="%d"),
        "model": st.column_config.TextColumn("model", pinned=True),
        metric: fmt(metric_label), f"{metric}_lo": fmt(f"{metric_label}: 95% lo"),
        f"{metric}_hi": fmt(f"{metric_label}: 95% hi"),
        "not_ranked_because": st.column_config.TextColumn("not ranked because"),
        "verified": check("verified"), "partial": check("partial"), "pinned_suite": check("pinned suite"),
        "params_m": num("params (M)", format="%.1f"),
        "construction_model": check("construction model"),
        "hub": st.column_config.LinkColumn("hub", display_text="open"),
        **{c: (pp if is_pp(c) else pct)(c.replace("_", " ")) for c in secondary},
        **{c: pct(c.split("/", 1)[1]) for c in shift_cols},
    }
    show_df(shown[cols], column_config=column_config, key=key, width="stretch")


@guarded("heatmap")
def _heatmap(view: pd.DataFrame, configs: list[str]) -> None:
    import plotly.graph_objects as go

    if view.empty:
        st.info("No model matches the filters.")
        return
    st.caption("Colour = acc@1 on a fixed 0–100% scale, chosen on purpose so that colours mean the same on every "
               "board and a few points of difference look like a few points. Every model of the view is a row "
               "(scroll the chart), labelled by its official rank or '(not ranked)'; hover for the value.")
    z = view[[f"acc1/{c}" for c in configs]].to_numpy(dtype=float) * 100
    labels = [("(not ranked)" if pd.isna(r) else f"#{int(r)}") + f" {plot_label(m)}"
              for r, m in zip(view["rank"], view["model"])]
    fig = go.Figure(go.Heatmap(z=z, x=[plot_label(c) for c in configs], y=labels, colorscale="Viridis",
                               zmin=0, zmax=100, colorbar={"title": {"text": "acc@1 % (fixed 0–100)"}},
                               hovertemplate="%{y}<br>%{x}: %{z:.1f}%<extra></extra>"))
    fig.update_layout(height=max(320, 18 * len(view) + 160), yaxis={"autorange": "reversed", "dtick": 1},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    st.plotly_chart(fig, key="heatmap")


@guarded("ID/OOD")
def _id_ood(store: Store, suite: str, board: str, view: pd.DataFrame, family_kind: str) -> None:
    import plotly.graph_objects as go
    from scipy.stats import norm

    ranked = view[~view["construction_model"]]
    if family_kind != "imagenet_star":
        st.info("ID/OOD fits need ImageNet* results (a reference config and shifts).")
        return
    id_file = os.environ.get("GENSHIFT_ID_ACCURACY") or None
    axes = ["suite reference config"] + (["ImageNet-val top-1 (--id-accuracy)"] if id_file else [])
    from_url("x", axes)
    axis = st.radio("In-distribution axis", axes, key="x", bind=binding("x"), horizontal=True)
    id_acc = None
    if axis != axes[0]:
        table = get_id_accuracy(id_file, os.path.getmtime(id_file))
        matched, unmatched = aggregate.join_id_accuracy(list(ranked["model"]), table,
                                                        aggregate.eval_sizes(store.for_suite(suite, board)))
        st.text(f"ImageNet-val accuracy from {os.path.basename(id_file)}: {len(matched)} of {len(ranked)} models "
                f"matched, {len(unmatched)} unmatched (left out of the fit).")
        if unmatched:
            with st.expander("Unmatched models"):
                show_df(pd.DataFrame({"model": unmatched}), key="id_unmatched")
        id_acc = tuple(sorted(matched.items()))
    fits = get_fits(store, store.fingerprint, suite, board, tuple(ranked["model"]), id_acc)
    if not fits or not fits["shifts"]:
        st.info("ID/OOD fits need results of at least two models on the same suite revision.")
        return
    n = len(fits["models"])
    if n < aggregate.MIN_FIT_MODELS:
        st.warning(f"Only {n} models: a line through fewer than {aggregate.MIN_FIT_MODELS} points is poorly "
                   "determined. Read the slope and the effective robustness with the confidence band in mind.")
    shifts = list(fits["shifts"])
    from_url("shift", shifts)
    shift = st.selectbox("Shift", shifts, key="shift", bind=binding("shift"))
    f = fits["shifts"][shift]
    x = np.array(fits["id_accuracy"])
    y = ranked.set_index("model")[f"acc1/{shift}"].reindex(fits["models"]).to_numpy()
    fig = go.Figure(go.Scatter(x=100 * x, y=100 * y, mode="markers", name="models",
                               text=[plot_label(m) for m in fits["models"]], hoverinfo="text+x+y"))
    grid = np.linspace(max(0.001, x.min() - 0.02), min(0.999, x.max() + 0.02), 60)
    ok = ~np.isnan(y)
    for scale, fn in (("linear", lambda g, a, b: a * g + b),
                      ("probit", lambda g, a, b: norm.cdf(a * norm.ppf(g) + b))):
        fit = f[scale]
        if not np.isfinite(fit["slope"]):
            continue
        lo, hi = aggregate.fit_band(x[ok], y[ok], grid, scale=scale)
        if np.isfinite(lo).all():
            fig.add_trace(go.Scatter(x=np.concatenate([100 * grid, 100 * grid[::-1]]),
                                     y=np.concatenate([100 * hi, 100 * lo[::-1]]), fill="toself", mode="lines",
                                     line={"width": 0}, opacity=0.2, name=f"{scale} fit: 95% confidence band",
                                     hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=100 * grid, y=100 * fn(grid, fit["slope"], fit["intercept"]), mode="lines",
                                 name=f"{scale} fit (slope {fit['slope']:.2f}, R² {fit['r2']:.2f}, n {fit['n']})"))
    fig.update_layout(xaxis_title=plot_label(f"in-distribution acc@1 % ({fits['id_axis']})"),
                      yaxis_title=plot_label(f"{shift} acc@1 %"))
    st.plotly_chart(fig, key="id_ood")
    er = pd.DataFrame({"model": f["linear"]["models"],
                       "effective_robustness_linear": 100 * np.array(f["linear"]["effective_robustness"], float),
                       "effective_robustness_probit": 100 * np.array(f["probit"]["effective_robustness"], float)})
    er = er.sort_values(["effective_robustness_linear", "model"], ascending=[False, True], na_position="last")
    st.caption("Effective robustness: a model's shift accuracy minus the fitted line's prediction at its "
               "in-distribution accuracy (Taori et al., 2020), in percentage points, most robust first.")
    show_df(er, key="effective_robustness", column_config={
        "effective_robustness_linear": st.column_config.NumberColumn("eff. robustness, linear (pp)", format=PP),
        "effective_robustness_probit": st.column_config.NumberColumn("eff. robustness, probit (pp)", format=PP)})
    impact = fits.get("shift_impact") or {}
    if impact:
        rows = [{"shift": sh, "shift_impact": 100 * v["value"] if v["value"] is not None else np.nan,
                 "ci_lo": 100 * v["ci"][0] if v["ci"] else np.nan, "ci_hi": 100 * v["ci"][1] if v["ci"] else np.nan,
                 "models": v["n"]} for sh, v in impact.items()]
        st.caption("Shift impact (Vendrow et al.): per shift, the drop acc(reference) − acc(shift) averaged over "
                   "the models on this board, with a 95% t interval over models, in percentage points. Not a "
                   "model's own mean impact over shifts (the table's 'model mean impact').")
        show_df(pd.DataFrame(rows).sort_values(["shift_impact", "shift"], ascending=[False, True]), key="shift_impact",
                column_config={"shift_impact": st.column_config.NumberColumn("shift impact (pp)", format=PP),
                               "ci_lo": st.column_config.NumberColumn("95% CI lo (pp)", format=PP),
                               "ci_hi": st.column_config.NumberColumn("95% CI hi (pp)", format=PP)})


@guarded("drilldown")
def _drilldown(store: Store, suite: str, board: str, view: pd.DataFrame, configs: list[str]) -> None:
    import plotly.graph_objects as go

    models = list(view["model"])
    if not models:
        st.info("No model matches the filters.")
        return
    from_url("model", models)
    model = st.selectbox("Model", models, key="model", bind=binding("model"))
    entry = next(e for e in store.for_suite(suite, board) if str(e.model_id) == model)
    r = entry.result
    if entry.verified:
        st.success("Verified: images re-run through the model match the stored predictions (signed stamp).")
        s = entry.stamp or {}
        n = s.get("recheck", {}).get("n", "?") if isinstance(s.get("recheck"), dict) else s.get("recheck", "?")
        st.text(f"stamp: {n} images re-run, verified at {s.get('verified_at', '?')}")
    else:
        st.warning("Not verified by a model re-run (hashes and recomputed metrics check out).")
        if entry.note:
            st.text(f"why: {entry.note}")
    cm = r["metrics"]["configs"]
    vals = [100 * aggregate._v(cm[c]["acc1"]) for c in configs if c in cm]
    lo = [100 * aggregate._ci(cm[c]["acc1"], 0) for c in configs if c in cm]
    hi = [100 * aggregate._ci(cm[c]["acc1"], 1) for c in configs if c in cm]
    names = [plot_label(c) for c in configs if c in cm]
    fig = go.Figure(go.Bar(x=names, y=vals, error_y={"type": "data", "symmetric": False,
                                                     "array": np.subtract(hi, vals), "arrayminus": np.subtract(vals, lo)}))
    fig.update_layout(yaxis_title="acc@1 % (95% interval)", height=340)
    st.plotly_chart(fig, key="drill_bars")
    from_url("drill_config", configs)
    config = st.selectbox("Worst classes on", configs, key="drill_config", bind=binding("drill_config"))
    worst = aggregate.per_class_accuracy(entry, config).head(15)
    show_df(worst[["class", "acc1", "n"]], key="worst_classes",
            column_config={"acc1": st.column_config.NumberColumn("acc@1", format="percent")})
    prov = {
        "model id": r["model"]["id"], "weights revision": r["model"].get("weights_revision") or "-",
        "weights sha256": r["model"].get("weights_sha256") or "-", "suite": r["suite"]["id"],
        "dataset revision": r["suite"].get("revision") or "(local)", "manifest sha256": r["suite"]["manifest_sha256"],
        "config hash": r["config_hash"], "code version": r["environment"].get("code_version") or "-",
        "timm": r["environment"].get("timm") or "-", "torch": r["environment"].get("torch") or "-",
        "preprocessing": ", ".join(f"{k}={v}" for k, v in r["data_config"].items()),
        "finished": r.get("finished_at", ""), "flags": ", ".join(k for k, v in r["flags"].items() if v) or "-",
    }
    show_df(pd.DataFrame({"field": list(prov), "value": [str(v) for v in prov.values()]}), key="provenance")
    if r.get("notes"):
        st.text("notes: " + str(r["notes"]))
    _failure_directions(entry)


def _failure_directions(entry) -> None:
    from genshift.eval.diagnose_report import load_report_for_view

    report = load_report_for_view(entry.run_dir)
    if report is None:
        return
    st.subheader("Failure directions")
    st.caption("Where the model fails, in pictures (bench diagnose; Jain et al., ICLR 2023): per class, a direction "
               "in CLIP space that separates its mistakes, its strength (cross-validated balanced accuracy) against "
               "a permutation null, and the hardest and easiest images along it.")
    for d in report["classes"][:5]:
        with st.container(border=True):
            st.text(f"class {d['label']} {d['name']}: strength {d['strength_text']} vs null p95 {d['null_text']}; "
                    f"{d['n_errors']} errors of {d['n']}")
            if not d["significant"]:
                st.text("not significant: the direction is no stronger than its permutation null's 95th percentile, "
                        "so its caption and images may describe noise")
            elif d["hard_caption"]:
                st.text(f"hard images: {d['hard_caption']}")
            for kind in ("hardest", "easiest"):
                imgs = [(i, report["thumbnails"][i]) for i in d[kind] if i in report["thumbnails"]]
                if imgs:
                    st.text(kind)
                    cols = st.columns(max(len(imgs), 1))
                    for col, (iid, data) in zip(cols, imgs):
                        col.image(io.BytesIO(base64.b64decode(data)), width=96)
                        col.text(iid[:24])


def _rejected(store: Store, skipped: list) -> None:
    def name(e):
        return str(e.path.relative_to(store.root)) if store.root in e.path.parents else str(e.path)

    rows = [{"entry": name(e), "status": e.status, "reason": e.reason} for e in store.rejected + store.superseded]
    rows += [{"entry": m, "status": "not shown", "reason": why} for m, why in skipped]
    rows += [{"entry": name(e), "status": "flagged", "reason": f} for e in store.entries for f in e.flags]
    if rows:
        show_df(pd.DataFrame(rows), key="rejected")
    else:
        st.text("No rejected, superseded or flagged entries.")


def _about() -> None:
    st.markdown(ABOUT)  # fixed text (leaderboard/about.py), no data in it
