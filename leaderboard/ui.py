"""The leaderboard's page (Streamlit): :func:`main` with one :class:`Settings` (``docs/leaderboard.md``, "What the
app shows"). Text from results is never rendered as Markdown or HTML (dataframe cells, ``st.text``, widget options,
neutralised plot labels only: "Trust")."""

from __future__ import annotations

import base64
import io
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from genshift.errors import IntegrityError, one_line
from genshift.families import FAMILIES, get_family, interval
from genshift.hubio import is_repo_id
from genshift.leaderboard import Settings, aggregate
from genshift.leaderboard.store import Store, load_store, read_entries

TABS = ["About", "Shift heatmap", "ID/OOD", "Model drilldown", "Rejected"]
COLUMNS = ["per-shift acc@1", "other metrics", "model details", "trust details"]
ARXIV = re.compile(r"(\d{4}\.\d{4,5})(v\d+)?")
# viewers get no "Stop" button while a run is in progress (the toolbar's developer options are off in
# viewer mode, see `bench leaderboard`); a fixed style sheet, no data in it
VIEWER_CSS = "<style>[data-testid='stStatusWidget'] button {display: none}</style>"
REPORTED = "Reported in the paper"
# The downloads (``docs/leaderboard.md``, "Search and filters"): the page's units in every header, rounded to
# DECIMALS places, plain JSON; text cells a spreadsheet would run as a formula get a leading apostrophe in the CSV
# (OWASP, "CSV Injection").
DECIMALS = {"%": 2, "pp": 2, "params (M)": 3}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# column key -> unit, as the metric families declare them
UNITS = {"base_acc1": "%", "effective_robustness": "pp", "shift_impact": "pp",
         **{m.key: m.unit for name in FAMILIES for m in get_family(name).metrics}}


@st.cache_data(show_spinner=False, max_entries=1_000)
def _entries(paths_digests: tuple, _paths, _files, _trust):
    """:func:`read_entries`, cached by the entries' paths and digests (of their files and the trust settings)."""
    return read_entries(_paths, _files, _trust)


@st.cache_data(show_spinner=False, max_entries=64)
def _ranks(digests: tuple, _entries, family: str, configs: tuple):
    return aggregate.rank_intervals(_entries, family=family, configs=list(configs))


@st.cache_resource
def _stale() -> dict:
    """Entries a view found stale (record digest -> why): marked for every session at once."""
    return {}


def unit(col: str) -> str:
    """The unit of a board column: ``"pp"`` for differences of two accuracies/probabilities, ``"%"`` for accuracies
    and rates (as its family declares the metric; ``<key>/<config>`` and ``<key>_lo``/``_hi`` too), else ""."""
    key = col.split("/", 1)[0]
    for suffix in ("_lo", "_hi", "_linear", "_probit"):
        key = key.removesuffix(suffix)
    return UNITS.get(key, "")


def with_units(view: pd.DataFrame) -> pd.DataFrame:
    """A copy in the page's units (fractions x 100), rounded (:data:`DECIMALS`), whose headers name them."""
    out = view.drop(columns="ranked", errors="ignore")
    names = {"params_m": "params (M)"}
    for col in out.columns:
        u = unit(col)
        if u and pd.api.types.is_float_dtype(out[col]):
            out[col] = (out[col] * 100).round(DECIMALS[u])
            names[col] = f"{col.replace('acc1/', 'acc@1/').replace('acc5/', 'acc@5/')} ({u})"
    out = out.astype({col: "Int64" for col in ("rank", "rank_lo", "rank_hi") if col in out.columns})
    return out.round({"params_m": DECIMALS["params (M)"]}).rename(columns=names)  # a column not there is ignored


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
    import json

    rows = with_units(view).astype(object).where(lambda d: d.notna(), None).to_dict(orient="records")
    return json.dumps(rows, indent=1, ensure_ascii=False, allow_nan=False, default=lambda v: v.item()).encode()


def plot_label(text) -> str:
    """Plot tick/hover labels: plotly interprets a few HTML tags in strings, so neutralise them."""
    return str(text).replace("&", "＆").replace("<", "‹").replace(">", "›")


def show_df(df: pd.DataFrame, target=st, **kw) -> None:
    """Every dataframe goes through here: data-derived text stays text (a cell, never Markdown), a missing
    value is "-" (never None or nan)."""
    target.dataframe(df, hide_index=True, placeholder="-", **kw)


def one_decimal(label: str):
    """A number column shown with one decimal (percent, percentage points, millions)."""
    return st.column_config.NumberColumn(label, format="%.1f")


def main(settings: Settings | None = None) -> None:
    """One run of the page."""
    settings = settings or Settings()
    st.set_page_config(page_title=settings.title, layout="wide")
    st.html(VIEWER_CSS)
    st.title(settings.title)
    try:  # every entry's record, read (or taken from the cache by its digest)
        with st.spinner("Opening the results store ..."):
            bar = st.progress(0.0, text="reading the entries")
            store = load_store(settings.results, trusted_keys=settings.trusted_keys, stale=_stale(),
                               suites=[settings.suites] if settings.suites else None,
                               read=lambda paths, files, t: _entries(
                                   tuple((str(p), f[2]) for p, f in zip(paths, files)), paths, files, t),
                               progress=lambda i, n: bar.progress(i / n, text=f"reading {i} of {n} entries"))
        bar.empty()
    except Exception as e:  # noqa: BLE001 - one line for the visitor, never a traceback
        st.error("Could not open the results store.")
        st.text(one_line(e, 400))
        st.stop()
    st.caption("Robustness of ImageNet classifiers to generated distribution shifts. Only verified, complete entries "
               "are ranked: a maintainer re-ran their images and signed their record (see About).")
    pinned = f" @ {store.revision}" if store.revision and store.revision not in store.source else ""
    keys = f" | trusted keys: {os.path.basename(settings.trusted_keys)}" if settings.trusted_keys else ""
    verified = sum(e.verified for e in store.entries)
    st.text(f"results store: {store.source}{pinned} | {len(store.entries)} results ({verified} verified), "
            f"{len(store.rejected)} rejected, {len(store.superseded)} superseded{keys}")
    if not store.entries:
        st.info("No results yet. Score a model with `bench eval --model <timm name> --suite <suite> --out "
                "<store>` or open a pull request with `bench submit`.")
        _reported(None)
        _rejected(store, [])
        st.stop()

    suite = st.sidebar.selectbox("Suite", store.suites(), key="suite", bind="query-params")
    boards = store.boards(suite)
    board = st.sidebar.selectbox("Board (suite data × protocol)", boards, key="board", bind="query-params") \
        if len(boards) > 1 else boards[0]
    entries = store.for_suite(suite, board)
    board_df, meta = aggregate.board_table(entries)
    keep, groups = _filters(board_df)
    view = board_df[keep(board_df)].reset_index(drop=True)
    n_ranked = int(board_df["ranked"].sum())
    st.subheader("Official ranking (verified, complete entries)")
    st.text(f"suite {suite}, ranked by {meta['metric_label']}" + ("" if meta["higher"] else " (lower is better)"))
    slot = st.empty()
    if n_ranked == 0:
        st.info("No verified, complete entry on this board yet, so nothing is ranked. The entries below are "
                "community entries: not verified, not ranked.")
    else:
        shown = int(view["ranked"].sum())
        st.caption(f"Ranks are among the {n_ranked} verified, complete entries of this board"
                   + (f"; {shown} shown after the filters" if shown != n_ranked else "") + ". Filters hide rows and "
                   "never re-rank; tied models share a rank. Rank and metric intervals are 95% paired-bootstrap "
                   "intervals over images, computed over the same ranked entries. Accuracies and rates are in "
                   "percent, differences (impact, Δ) in percentage points (pp), one decimal.")
        _table(slot, view[view["ranked"]], meta, groups, ranked=True)
    community = view[~view["ranked"]]
    if not st.session_state.get("verified") and len(community):
        st.subheader("Community entries (not verified, not ranked)")
        st.caption("Unverified, partial or stale entries, and construction models: their numbers are the results' "
                   "own, no maintainer has re-run their images, so they hold no rank.")
        _table(st, community, meta, groups, ranked=False)
    # the downloads are made when clicked, from the final view (the closures read `view` then: with its intervals)
    c1, c2, name = *st.columns(2), re.sub(r"[^A-Za-z0-9._-]+", "_", suite)[:80] or "board"
    c1.download_button("Download CSV", lambda: to_csv_bytes(view), mime="text/csv", key="download_csv",
                       file_name=f"{name}-leaderboard.csv")
    c2.download_button("Download JSON", lambda: to_json_bytes(view), mime="application/json",
                       file_name=f"{name}-leaderboard.json", key="download_json")
    with st.expander("Top 10 as text"):
        st.text("\n".join(f"{int(r.rank):>3}  {r.model}  {100 * getattr(r, meta['metric']):.1f}"
                          for r in view[view["ranked"]].head(10).itertuples()) or "nothing is ranked on this board")
    _reported(suite)
    if settings.hub_results:  # the Hub's side, never ranked
        _hub_reported(entries)
    if n_ranked:  # after the table was sent: the intervals fill it in (cached by the ranked records' digests)
        ranked_ids = set(board_df.loc[board_df["ranked"], "model"])
        ranked = [e for e in entries if e.model_id in ranked_ids]
        if ranks := _ranks(tuple(e.digest for e in ranked), ranked, meta["family"], tuple(meta["rank_configs"])):
            board_df, meta = aggregate.board_table(entries, ranks=ranks)
            view = board_df[keep(board_df)].reset_index(drop=True)
            _table(slot, view[view["ranked"]], meta, groups, ranked=True)
    views = (lambda: st.markdown(Path(__file__).with_name("about.md").read_text()),  # as docs/leaderboard.md says
             lambda: _heatmap(view, meta), lambda: _id_ood(settings, entries, view, meta),
             lambda: _drilldown(entries, view, meta), lambda: _rejected(store, meta["skipped"]))
    for tab, name, draw in zip(st.tabs(TABS, key="tab", bind="query-params"), TABS, views):
        if not tab.open:
            continue
        with tab:
            try:
                if view.empty and name in ("Shift heatmap", "Model drilldown"):
                    st.info("No model matches the filters.")
                else:
                    draw()
            except Exception as e:  # noqa: BLE001 - one view that fails shows why; the rest of the board stays up
                if type(e).__name__ in ("StopException", "RerunException"):
                    raise
                st.error(f"The {name} view could not be drawn for this selection.")
                st.text(f"{type(e).__name__}: {e}")


def _filters(df: pd.DataFrame):
    """The sidebar's filters (all in the URL): a function selecting the rows they keep, and the column groups."""
    q = st.sidebar.text_input("Search models", key="q", bind="query-params").strip().lower()
    picked = {col: st.sidebar.multiselect(label, sorted(df[col].unique()), key=col, bind="query-params")
              for col, label in (("family", "Architecture family"), ("pretraining", "Pretraining data"))}
    top = max(float(np.ceil(df["params_m"].max() + 1e-9)), 1.0)
    lo, hi = st.sidebar.slider("Parameters (M)", 0.0, top, (0.0, top), key="params", bind="query-params")
    verified = st.sidebar.checkbox("Verified only (hide the community entries)", key="verified", bind="query-params")
    construction = st.sidebar.checkbox("Show construction models (biased by construction, never ranked)",
                                       key="construction", bind="query-params")
    groups = st.sidebar.multiselect("More columns", COLUMNS, default=COLUMNS[:1], key="columns", bind="query-params")

    def keep(d: pd.DataFrame) -> pd.Series:  # filters select rows, never re-rank
        k = d["params_m"].between(lo, hi) & (d["verified"] | (not verified)) & (~d["construction_model"] | construction)
        for col, chosen in picked.items():
            if chosen:
                k &= d[col].isin(chosen)
        if q:
            k &= d["model"].str.lower().str.contains(q, regex=False) | d["architecture"].str.lower().str.contains(
                q, regex=False)
        return k
    return keep, groups


def _table(target, view: pd.DataFrame, meta: dict, groups: list, *, ranked: bool) -> None:
    num, text, link = st.column_config.NumberColumn, st.column_config.TextColumn, st.column_config.LinkColumn
    metric, base = meta["metric"], meta["base"]
    label = f"{meta['metric_label']} ({unit(metric)})" if unit(metric) else meta["metric_label"]
    shown = view.copy()
    for c in shown.columns:
        if unit(c) and pd.api.types.is_float_dtype(shown[c]):
            shown[c] = shown[c] * 100  # fractions -> percent or percentage points
    shown["verified"] = np.where(shown["verified"], "✓ verified", "✗ not verified")
    for c in ("partial", "pinned_suite", "construction_model"):
        shown[c] = np.where(shown[c], "yes", "no")
    # the Hub model card (Hub weights only: local weights link nowhere) and the arXiv paper, or None
    shown["card"] = [f"https://huggingface.co/{m}" if w == "Hub" else None for m, w in zip(view.model, view.weights)]
    shown["paper"] = [f"https://arxiv.org/abs/{a.group(1)}" if (a := ARXIV.search(p)) else None for p in view.paper]
    secondary = [m for m in get_family(meta["family"]).metrics if not m.per and m.key in shown.columns
                 and m.key not in (metric, "mean_shift_acc1", "mean_acc1")]
    cols = ((["rank"] if ranked else []) + ["model", metric, f"{metric}_lo", f"{metric}_hi"]
            + (["base_acc1"] if base else []) + ["verified", "weights", "flags"]
            + (["rank_lo", "rank_hi"] if ranked else ["not_ranked_because"]))
    extra = {COLUMNS[0]: [f"acc1/{c}" for c in meta["configs"] if c != base], COLUMNS[1]: [m.key for m in secondary],
             COLUMNS[2]: ["family", "params_m", "pretraining", "architecture", "card", "paper"],
             COLUMNS[3]: ["partial", "pinned_suite", "construction_model"]}
    cols += [c for g in groups for c in extra.get(g, [])]
    decimal = {metric: label, f"{metric}_lo": "95% lo", f"{metric}_hi": "95% hi", "params_m": "params (M)",
               "base_acc1": f"{base} acc@1 (%)", **{c: f"{c.split('/', 1)[1]} (%)" for c in extra[COLUMNS[0]]},
               **{m.key: f"{m.label} ({m.unit})" for m in secondary}}  # column -> label, shown with one decimal
    config = {"rank": num("rank", format="%d", pinned=True), "model": text("model", pinned=True),
              "rank_lo": num("rank lo", format="%d"), "rank_hi": num("rank hi", format="%d"),
              "not_ranked_because": text("not ranked because", width="large"), "pinned_suite": text("pinned suite"),
              "construction_model": text("construction model"), "card": link("card", display_text="model card"),
              "paper": link("paper", display_text="paper"), **{c: one_decimal(v) for c, v in decimal.items()}}
    show_df(shown[cols], target, column_config=config, width="stretch",
            alt="official ranking" if ranked else "community entries")


def heatmap_figure(view: pd.DataFrame, configs: list[str]):
    import plotly.graph_objects as go

    z = view[[f"acc1/{c}" for c in configs]].to_numpy(dtype=float) * 100
    labels = [("(not ranked)" if pd.isna(r) else f"#{int(r)}") + f" {plot_label(m)}"
              for r, m in zip(view["rank"], view["model"])]
    fig = go.Figure(go.Heatmap(z=z, x=[plot_label(c) for c in configs], y=labels, colorscale="Viridis", zmin=0,
                               zmax=100, texttemplate="%{z:.1f}", colorbar={"title": {"text": "acc@1 % (fixed 0–100)"}},
                               hovertemplate="%{y}<br>%{x}: %{z:.1f}%<extra></extra>"))
    fig.update_layout(height=max(320, 22 * len(view) + 160), yaxis={"autorange": "reversed", "dtick": 1},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return fig


def _heatmap(view: pd.DataFrame, meta: dict) -> None:
    st.caption("acc@1 in percent, written in each cell; the colour scale is fixed at 0–100% on purpose, so that a "
               "colour means the same on every board and a few points of difference look like a few points. Rows "
               "are labelled by the official rank or '(not ranked)'.")
    st.plotly_chart(heatmap_figure(view, meta["configs"]), key="heatmap")


def id_ood_figure(x, y, models: list[str], fit: dict, *, shift: str, axis: str):
    """Shift accuracy against in-distribution accuracy (fractions in; the chart is in percent on one scale
    for both axes, so a slope reads as drawn): labelled points, ``y = x``, and each fit with its 95% band,
    all clipped to [0, 100]."""
    import plotly.graph_objects as go
    from scipy.stats import norm

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = ~np.isnan(y)
    lo = max(0.0, 5 * np.floor(min(x.min(), np.nanmin(y)) * 20) - 5)
    hi = min(100.0, 5 * np.ceil(max(x.max(), np.nanmax(y)) * 20) + 5)
    grid = np.linspace(max(0.001, lo / 100), min(0.999, hi / 100), 80)
    inside = lambda v: np.where((v >= lo / 100) & (v <= hi / 100), 100 * v, np.nan)  # noqa: E731
    fig = go.Figure(go.Scatter(x=100 * x, y=100 * y, mode="markers+text", name="models",
                               text=[plot_label(m.split("/")[-1]) for m in models], textposition="top center",
                               hovertext=[plot_label(m) for m in models], hoverinfo="text+x+y"))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x (no drop)",
                             line={"dash": "dot", "color": "grey"}))
    for scale, fn in (("linear", lambda g, a, b: a * g + b), ("probit", lambda g, a, b: norm.cdf(a * norm.ppf(g) + b))):
        f = fit[scale]
        if not np.isfinite(f["slope"]):
            continue
        band_lo, band_hi = aggregate.fit_band(x[ok], y[ok], grid, scale=scale)
        if np.isfinite(band_lo).all():
            band = np.clip(np.concatenate([band_hi, band_lo[::-1]]), lo / 100, hi / 100)
            fig.add_trace(go.Scatter(x=np.concatenate([100 * grid, 100 * grid[::-1]]), y=100 * band, fill="toself",
                                     mode="lines", line={"width": 0}, opacity=0.2, hoverinfo="skip",
                                     name=f"{scale} fit: 95% confidence band"))
        fig.add_trace(go.Scatter(x=100 * grid, y=inside(fn(grid, f["slope"], f["intercept"])), mode="lines",
                                 name=f"{scale} fit: slope {f['slope']:.2f} (R² {f['r2']:.2f}, n {f['n']})"))
    fig.update_layout(height=620, xaxis={"title": plot_label(f"in-distribution acc@1 % ({axis})"), "range": [lo, hi]},
                      yaxis={"title": plot_label(f"{shift} acc@1 %"), "range": [lo, hi], "scaleanchor": "x",
                             "scaleratio": 1})
    return fig


def _id_ood(settings: Settings, entries: list, view: pd.DataFrame, meta: dict) -> None:
    if not meta["base"]:
        st.info("ID/OOD fits need a suite scored against a reference config (ImageNet*'s base) and its shifts.")
        return
    ranked = view[~view["construction_model"]]
    axes = ["suite reference config"] + (["ImageNet-val top-1 (--id-accuracy)"] if settings.id_accuracy else [])
    axis = st.radio("In-distribution axis", axes, key="x", bind="query-params", horizontal=True)
    id_acc, chosen = None, [e for e in entries if e.model_id in set(ranked["model"])]
    if axis != axes[0]:
        table = aggregate.read_id_accuracy(settings.id_accuracy)
        id_acc, unmatched = aggregate.join_id_accuracy(list(ranked["model"]), table, aggregate.eval_sizes(chosen))
        st.text(f"ImageNet-val accuracy from {os.path.basename(settings.id_accuracy)}: {len(id_acc)} of "
                f"{len(ranked)} models matched, {len(unmatched)} unmatched (left out of the fit).")
        if unmatched:
            with st.expander("Unmatched models"):
                show_df(pd.DataFrame({"model": unmatched}), key="id_unmatched")
    fits = aggregate.slope_fits(chosen, id_accuracy=id_acc)
    if not fits or not fits["shifts"]:
        st.info("ID/OOD fits need results of at least two models on the same suite revision.")
        return
    if len(fits["models"]) < aggregate.MIN_FIT_MODELS:
        st.warning(f"Only {len(fits['models'])} models: a line through fewer than {aggregate.MIN_FIT_MODELS} points "
                   "is poorly determined. Read the slope and the effective robustness with the band in mind.")
    shift = st.selectbox("Shift", list(fits["shifts"]), key="shift", bind="query-params")
    f = fits["shifts"][shift]
    y = ranked.set_index("model")[f"acc1/{shift}"].reindex(fits["models"]).to_numpy()
    st.plotly_chart(id_ood_figure(fits["id_accuracy"], y, fits["models"], f, shift=shift, axis=fits["id_axis"]),
                    key="id_ood")
    st.caption("Both axes in percent on one scale: a fit's slope is the slope drawn, and points below the dotted "
               "y = x line lost accuracy under the shift. Effective robustness: a model's shift accuracy minus the "
               "fitted line's prediction at its in-distribution accuracy (Taori et al., 2020), in percentage "
               "points, most robust first.")
    scales = ("linear", "probit")
    er = pd.DataFrame({"model": f["linear"]["models"]} | {
        f"effective_robustness_{s}": 100 * np.array(f[s]["effective_robustness"], float) for s in scales})
    show_df(er.sort_values(["effective_robustness_linear", "model"], ascending=[False, True], na_position="last"),
            key="effective_robustness",
            column_config={f"effective_robustness_{s}": one_decimal(f"eff. robustness, {s} (pp)") for s in scales})
    impact = fits.get("shift_impact") or {}
    if impact:
        rows = [{"shift": sh, **{k: 100 * x for k, x in interval("shift_impact", v).items()}, "models": v["n"]}
                for sh, v in impact.items()]
        st.caption("Shift impact (Vendrow et al.): per shift, the drop acc(reference) − acc(shift) averaged over "
                   "the models on this board, with a 95% t interval over models, in percentage points. Not a "
                   "model's own mean impact over shifts (the table's 'model mean impact').")
        show_df(pd.DataFrame(rows).sort_values(["shift_impact", "shift"], ascending=[False, True]), key="shift_impact",
                column_config={"shift_impact": one_decimal("shift impact (pp)"),
                               "shift_impact_lo": one_decimal("95% CI lo (pp)"),
                               "shift_impact_hi": one_decimal("95% CI hi (pp)")})


def _drilldown(entries: list, view: pd.DataFrame, meta: dict) -> None:
    """One model's record, and what only its files hold (hashed when read here: a changed file marks it stale)."""
    import plotly.graph_objects as go

    from genshift.eval.diagnose_report import load_report_for_view

    model = st.selectbox("Model", list(view["model"]), key="model", bind="query-params")
    entry = next(e for e in entries if e.model_id == model)
    rec, configs = entry.record, meta["configs"]
    if entry.verified:
        st.success("Verified: images re-run through the model match the stored predictions (signed record).")
        st.text(f"record: {rec['recheck']['n']} images re-run, verified at {rec.get('verified_at', '?')}")
    else:
        st.warning("Not verified: the numbers are the result's own.")
        st.text(f"why: {entry.note}")
    cm = rec["metrics"]["configs"]
    drawn = [c for c in configs if c in cm]
    acc, lo, hi = 100 * np.array([list(interval("acc1", cm[c]["acc1"]).values()) for c in drawn]).reshape(-1, 3).T
    fig = go.Figure(go.Bar(x=[plot_label(c) for c in drawn], y=list(acc), texttemplate="%{y:.1f}",
                           error_y={"type": "data", "symmetric": False, "array": hi - acc, "arrayminus": acc - lo}))
    fig.update_layout(yaxis={"title": "acc@1 % (95% interval)", "range": [0, 100]}, height=340)
    st.plotly_chart(fig, key="drill_bars")
    config = st.selectbox("Worst classes on", configs, key="drill_config", bind="query-params")
    try:
        entry.check()  # every file the record vouches for, hashed now
        r, worst = entry.result, aggregate.per_class_accuracy(entry, config).head(15)
    except IntegrityError as e:  # stale: marked for every session, and this page drawn again without its badge
        if _stale().get(entry.digest) != str(e):
            _stale()[entry.digest] = str(e)
            st.rerun()
        st.text(str(e))
        return
    show_df(worst[["class", "acc1", "n"]].assign(acc1=100 * worst["acc1"]), key="worst_classes",
            column_config={"acc1": one_decimal("acc@1 (%)")})
    m = r["model"]
    prov = {
        "model id": m["id"], "weights": "local weights" if entry.identity.local else "Hub",
        "declared name (a claim)": m.get("declared_name") or "-", "weights revision": m.get("weights_revision") or "-",
        "tensors sha256": m.get("tensors_sha256") or "-", "weights sha256": m.get("weights_sha256") or "-",
        "suite": r["suite"]["id"], "dataset revision": r["suite"].get("revision") or "(local)",
        "manifest sha256": r["suite"]["manifest_sha256"], "config hash": r["config_hash"],
        "code version": r["environment"].get("code_version") or "-", "timm": r["environment"].get("timm") or "-",
        "torch": r["environment"].get("torch") or "-",
        "preprocessing": ", ".join(f"{k}={v}" for k, v in r["data_config"].items()),
        "finished": r.get("finished_at", ""), "flags": ", ".join(k for k, v in r["flags"].items() if v) or "-",
    }
    show_df(pd.DataFrame({"field": list(prov), "value": [str(v) for v in prov.values()]}), key="provenance")
    if r.get("notes"):
        st.text("notes: " + str(r["notes"]))
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
                    for col, (iid, data) in zip(st.columns(len(imgs)), imgs):
                        col.image(io.BytesIO(base64.b64decode(data)), width=96)
                        col.text(iid[:24])


def _hub_reported(entries) -> None:
    """The "Reported on the Hub" table under the ranking, for each dataset the board's entries used."""
    from genshift.leaderboard.hub_results import HUB_COLUMNS, hub_reported  # the Hub client: only for this table
    datasets = sorted({ds for e in entries if is_repo_id(ds := str(e.record["suite"].get("repo_id") or ""))})
    st.subheader("Reported on the Hub")
    st.caption("Scores that model repos report for this suite's dataset through the Hub's eval-results system "
               "(.eval_results files; 'community' while their pull request is open). They are not verified by "
               "this leaderboard and are never ranked with the entries above; each links to its source.")
    if not datasets:
        st.text("This board's results were not scored on a Hub dataset repo.")
    for ds in datasets:
        rows, problems = st.cache_data(ttl=600, show_spinner=False)(hub_reported)(
            ds, endpoint=os.environ.get("HF_ENDPOINT") or None)
        st.text(f"datasets/{ds}: {len(rows)} reported")
        if rows:
            show_df(pd.DataFrame(rows, columns=list(HUB_COLUMNS)), key=f"hub_reported_{ds}",
                    column_config={"source": st.column_config.LinkColumn("source"),
                                   "value": st.column_config.NumberColumn("value (as reported)")})
        for p in problems[:20]:
            st.text(p)


def _rejected(store: Store, skipped: list) -> None:
    def name(e):
        return str(e.path.relative_to(store.root)) if store.root in e.path.parents else str(e.path)

    rows = [{"entry": name(e), "status": e.status, "reason": e.reason} for e in store.rejected + store.superseded]
    rows += [{"entry": m, "status": "not shown", "reason": why} for m, why in skipped]
    rows += [{"entry": name(e), "status": "flagged", "reason": f} for e in store.entries for f in e.flags]
    rows += [{"entry": name(e), "status": "stale", "reason": e.note} for e in store.entries if "stale" in e.note]
    if rows:
        show_df(pd.DataFrame(rows), key="rejected",
                column_config={"reason": st.column_config.TextColumn("reason", width="large")})
    else:
        st.text("No rejected, superseded, flagged or stale entries.")


def _reported(suite: str | None) -> None:
    """The papers' own numbers for one suite (all when None): never verified, never ranked (package data
    ``benchmark/_data/reported.yaml``)."""
    frame = aggregate.reported_frame(suite)
    if frame.empty:
        return
    st.subheader(REPORTED)
    st.caption("Numbers as printed in the papers (source per row): not recomputed, not verified and not ranked. Our "
               "own re-runs of these models are in the ranked table; `bench reproduce` prints both side by side.")
    show_df(frame, key=f"reported-{suite or 'all'}")
