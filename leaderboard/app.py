"""The genshift-bench leaderboard (Streamlit).

Launched by ``bench leaderboard [--results DIR|ORG/NAME[@sha]]``, which passes the store in the
``GENSHIFT_RESULTS`` environment variable. Everything shown comes from ``leaderboard.store`` and
``leaderboard.aggregate``; text from results (model names, notes) is only ever rendered as plain
text (dataframe cells, ``st.text``, ``st.code``), never as Markdown or HTML.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import streamlit as st

from leaderboard import aggregate
from leaderboard.export import to_csv_bytes
from leaderboard.store import STAMP, Store, load_store

SAFE_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
st.set_page_config(page_title="genshift-bench leaderboard", layout="wide")


def _signature(source: str) -> str:
    """Content key for the store cache: sizes and mtimes of every result/stamp (or the Hub source)."""
    root = os.path.abspath(source)
    if not os.path.isdir(root):
        return source
    parts = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f in ("result.json", STAMP):
                st_ = os.stat(os.path.join(dirpath, f))
                parts.append(f"{dirpath}/{f}:{st_.st_size}:{st_.st_mtime_ns}")
    return "|".join(sorted(parts))


@st.cache_resource(show_spinner="Loading and checking results ...", max_entries=4)
def get_store(source: str, signature: str) -> Store:
    return load_store(source, trusted_keys=os.environ.get("GENSHIFT_TRUSTED_KEYS") or None)


@st.cache_data(show_spinner=False, max_entries=32)
def get_table(_store: Store, fingerprint: str, suite: str, board: str) -> pd.DataFrame:
    return aggregate.model_table(_store.for_suite(suite, board))


@st.cache_data(show_spinner="Ranking with the paired bootstrap ...", max_entries=32)
def get_ranks(_store: Store, fingerprint: str, suite: str, board: str, models: tuple[str, ...],
              configs: tuple[str, ...], family: str) -> dict | None:
    entries = [e for e in _store.for_suite(suite, board) if e.model_id in set(models)]
    out = aggregate.rank_intervals(entries, family=family, configs=list(configs))
    return None if out is None else {k: (v.rank, v.lo, v.hi) for k, v in out.items()}


@st.cache_data(show_spinner=False, max_entries=32)
def get_fits(_store: Store, fingerprint: str, suite: str, board: str, models: tuple[str, ...]) -> dict | None:
    entries = [e for e in _store.for_suite(suite, board) if e.model_id in set(models)]
    return aggregate.slope_fits(entries)


def plot_label(text: str) -> str:
    """Plot tick/hover labels: plotly interprets a few HTML tags in strings, so neutralise them."""
    return text.replace("<", "‹").replace(">", "›").replace("&", "＆")


def _qp_list(name: str, allowed: list[str]) -> list[str]:
    return [v for v in st.query_params.get_all(name) if v in allowed]


def main() -> None:
    source = os.environ.get("GENSHIFT_RESULTS", "runs")
    st.title("genshift-bench leaderboard")
    try:
        store = get_store(source, _signature(source))
    except Exception as e:  # noqa: BLE001 - the app must show the problem, not a traceback
        st.error("Could not open the results store.")
        st.text(f"{type(e).__name__}: {e}")
        st.stop()
    st.caption("Robustness of ImageNet classifiers to generated distribution shifts. All numbers recompute from "
               "stored per-image predictions (bench verify).")
    st.text(f"results store: {store.source}" + (f" @ {store.revision}" if store.revision else "") +
            f" | {len(store.entries)} results, {len(store.rejected)} rejected, {len(store.superseded)} superseded")
    if not store.entries:
        st.info("No results yet. Score a model with `bench eval --model <timm name> --suite <suite> --out <store>` "
                "or open a pull request with `bench submit`.")
        _rejected(store)
        st.stop()

    suites = store.suites()
    qp_suite = st.query_params.get("suite")
    suite = st.sidebar.selectbox("Suite", suites, index=suites.index(qp_suite) if qp_suite in suites else 0, key="suite")
    boards = store.boards(suite)
    board = boards[0]
    if len(boards) > 1:  # results on other suite revisions / protocols are never mixed into one table
        sizes = {b: len(store.for_suite(suite, b)) for b in boards}
        qp_board = st.query_params.get("board")
        board = st.sidebar.selectbox("Suite revision · protocol", boards,
                                     index=boards.index(qp_board) if qp_board in boards else 0,
                                     format_func=lambda b: f"manifest {b.split('-')[0]}… · protocol {b.split('-')[1]} "
                                                           f"({sizes[b]} models)", key="board")
        st.sidebar.caption(f"{len(boards) - 1} other revision/protocol board(s) of {suite}: their results are not "
                           "comparable with these and are shown on their own.")
    df = get_table(store, store.fingerprint, suite, board)
    family_kind = store.for_suite(suite, board)[0].result["suite"]["metric_family"]
    metric, higher, metric_label = aggregate.headline(family_kind)

    families = sorted(df["family"].unique())
    pretrain = sorted(df["pretraining"].unique())
    fam_sel = st.sidebar.multiselect("Architecture family", families, default=_qp_list("family", families), key="family")
    pre_sel = st.sidebar.multiselect("Pretraining data", pretrain, default=_qp_list("pretraining", pretrain),
                                     key="pretraining")
    pmax = float(np.ceil(df["params_m"].max() + 1e-9))
    params = st.sidebar.slider("Parameters (M)", 0.0, max(pmax, 1.0), (0.0, max(pmax, 1.0)), key="params")
    verified_only = st.sidebar.checkbox("Verified only", value=st.query_params.get("verified") == "1", key="verified")
    construction = st.sidebar.checkbox("Show construction models (biased by construction, never ranked)",
                                       value=st.query_params.get("construction") == "1", key="construction")
    st.query_params.from_dict({k: v for k, v in {
        "suite": suite, "board": board if len(boards) > 1 else None, "family": fam_sel, "pretraining": pre_sel,
        "verified": "1" if verified_only else None, "construction": "1" if construction else None,
    }.items() if v})

    view = df[(df["params_m"] >= params[0]) & (df["params_m"] <= params[1])]
    if fam_sel:
        view = view[view["family"].isin(fam_sel)]
    if pre_sel:
        view = view[view["pretraining"].isin(pre_sel)]
    if verified_only:
        view = view[view["verified"]]
    if not construction:
        view = view[~view["construction_model"]]
    view = view.sort_values(metric, ascending=not higher, na_position="last").reset_index(drop=True)

    ranked = view[~view["construction_model"]]
    configs = sorted(c[len("acc1/"):] for c in df.columns if c.startswith("acc1/"))
    rank_configs = [c for c in configs if family_kind != "imagenet_star" or c != "base"]
    ranks = get_ranks(store, store.fingerprint, suite, board, tuple(ranked["model"]), tuple(rank_configs),
                      family_kind) if len(ranked) else None
    view.insert(0, "rank", [ranks[m][0] if ranks and m in ranks else np.nan for m in view["model"]])
    view.insert(1, "rank_lo", [ranks[m][1] if ranks and m in ranks else np.nan for m in view["model"]])
    view.insert(2, "rank_hi", [ranks[m][2] if ranks and m in ranks else np.nan for m in view["model"]])
    view["hub"] = [f"https://huggingface.co/{m}" if SAFE_REPO.match(m) else None for m in view["model"]]

    st.subheader(f"{suite}: ranked by {metric_label}")
    st.caption("Ranks come with 95% intervals from a paired bootstrap over images (same resamples for every "
               "model). Accuracies and rates are fractions shown in percent.")
    pct = st.column_config.NumberColumn
    config_cols = {c: pct(c.split("/", 1)[1], format="percent") for c in view.columns
                   if c.startswith(("acc1/", "impact/", "delta_p/"))}
    column_config = {
        "rank": st.column_config.NumberColumn("rank", format="%d"),
        "rank_lo": st.column_config.NumberColumn("rank lo", format="%d"),
        "rank_hi": st.column_config.NumberColumn("rank hi", format="%d"),
        "model": st.column_config.TextColumn("model"),
        "params_m": st.column_config.NumberColumn("params (M)", format="%.1f"),
        "hub": st.column_config.LinkColumn("hub", display_text="open"),
        metric: pct(metric_label, format="percent"),
        **config_cols,
    }
    main_cols = ["rank", "rank_lo", "rank_hi", "model", "family", "params_m", "pretraining", "verified",
                 "construction_model", metric] + [c for c in ("model_mean_impact", "mean_delta_p",
                                                              "parent_failure_rate")
                                                 if c in view.columns]
    main_cols += [c for c in view.columns if c.startswith("acc1/")] + ["hub"]
    for c in ("model_mean_impact", "mean_delta_p", "parent_failure_rate", "top1_error"):
        column_config.setdefault(c, pct(c.replace("_", " "), format="percent"))
    st.dataframe(view[main_cols], column_config=column_config, hide_index=True, key="main_table",
                 width="stretch")
    c1, c2 = st.columns(2)
    c1.download_button("Download CSV", to_csv_bytes(view), file_name=f"{suite}-leaderboard.csv",
                       mime="text/csv", key="download_csv")
    c2.download_button("Download JSON", view.to_json(orient="records", indent=1).encode(),
                       file_name=f"{suite}-leaderboard.json", mime="application/json", key="download_json")
    # a plain-text rendering of the top rows (accessible, and readable without the canvas grid)
    with st.expander("Top 10 as text"):
        st.text("\n".join(f"{i + 1:>3}  {row.model}  {100 * row[metric]:.2f}" if pd.notna(row[metric]) else
                          f"{i + 1:>3}  {row.model}  -" for i, row in view.head(10).iterrows()))

    tabs = st.tabs(["Shift heatmap", "ID/OOD", "Model drilldown", f"Rejected ({len(store.rejected)})"])
    with tabs[0]:
        _heatmap(view, configs)
    with tabs[1]:
        _id_ood(store, suite, board, view, family_kind)
    with tabs[2]:
        _drilldown(store, suite, board, view, configs)
    with tabs[3]:
        _rejected(store)


def _heatmap(view: pd.DataFrame, configs: list[str]) -> None:
    import plotly.graph_objects as go

    if view.empty:
        st.info("No model matches the filters.")
        return
    top = view.head(40)
    z = np.array([[row[f"acc1/{c}"] * 100 for c in configs] for _, row in top.iterrows()])
    fig = go.Figure(go.Heatmap(z=z, x=configs, y=[plot_label(m) for m in top["model"]], colorscale="Viridis",
                               colorbar={"title": "acc@1 %"}))
    fig.update_layout(height=max(300, 22 * len(top) + 120), yaxis={"autorange": "reversed"})
    st.plotly_chart(fig, key="heatmap")


def _id_ood(store: Store, suite: str, board: str, view: pd.DataFrame, family_kind: str) -> None:
    import plotly.graph_objects as go
    from scipy.stats import norm

    ranked = view[~view["construction_model"]]
    fits = get_fits(store, store.fingerprint, suite, board, tuple(ranked["model"])) if family_kind == "imagenet_star" else None
    if not fits or not fits["shifts"]:
        st.info("ID/OOD fits need ImageNet* results of at least two models on the same suite revision.")
        return
    shifts = list(fits["shifts"])
    qp_shift = st.query_params.get("shift")
    shift = st.selectbox("Shift", shifts, index=shifts.index(qp_shift) if qp_shift in shifts else 0, key="shift")
    f = fits["shifts"][shift]
    x = np.array(fits["id_accuracy"])
    y = ranked.set_index("model")[f"acc1/{shift}"].reindex(fits["models"]).to_numpy()
    fig = go.Figure(go.Scatter(x=100 * x, y=100 * y, mode="markers", name="models",
                               text=[plot_label(m) for m in fits["models"]], hoverinfo="text+x+y"))
    grid = np.linspace(max(0.001, x.min() - 0.02), min(0.999, x.max() + 0.02), 50)
    lin, pro = f["linear"], f["probit"]
    if np.isfinite(lin["slope"]):
        fig.add_trace(go.Scatter(x=100 * grid, y=100 * (lin["slope"] * grid + lin["intercept"]), mode="lines",
                                 name=f"linear fit (slope {lin['slope']:.2f}, R² {lin['r2']:.2f})"))
    if np.isfinite(pro["slope"]):
        fig.add_trace(go.Scatter(x=100 * grid, y=100 * norm.cdf(pro["slope"] * norm.ppf(grid) + pro["intercept"]),
                                 mode="lines", name=f"probit fit (slope {pro['slope']:.2f}, R² {pro['r2']:.2f})"))
    fig.update_layout(xaxis_title=f"in-distribution acc@1 % ({fits['id_axis']})", yaxis_title=f"{shift} acc@1 %")
    st.plotly_chart(fig, key="id_ood")
    er = pd.DataFrame({"model": f["linear"]["models"], "effective_robustness_linear": f["linear"]["effective_robustness"],
                       "effective_robustness_probit": f["probit"]["effective_robustness"]})
    st.dataframe(er, hide_index=True, key="effective_robustness", column_config={
        "effective_robustness_linear": st.column_config.NumberColumn("eff. robustness (linear)", format="percent"),
        "effective_robustness_probit": st.column_config.NumberColumn("eff. robustness (probit)", format="percent")})


def _drilldown(store: Store, suite: str, board: str, view: pd.DataFrame, configs: list[str]) -> None:
    import plotly.graph_objects as go

    models = list(view["model"])
    if not models:
        st.info("No model matches the filters.")
        return
    qp_model = st.query_params.get("model")
    model = st.selectbox("Model", models, index=models.index(qp_model) if qp_model in models else 0, key="model")
    entry = next(e for e in store.for_suite(suite, board) if e.model_id == model)
    r = entry.result
    if entry.verified:
        st.success(f"verified: {entry.stamp['recheck']['n']} images re-run through the model match the stored predictions "
                   f"({entry.stamp.get('verified_at', '')})")
    else:
        st.warning("not verified by a model re-run (hashes and recomputed metrics check out)")
    row = view.set_index("model").loc[model]
    fig = go.Figure(go.Bar(x=configs, y=[100 * row[f"acc1/{c}"] for c in configs]))
    fig.update_layout(yaxis_title="acc@1 %", height=320)
    st.plotly_chart(fig, key="drill_bars")
    config = st.selectbox("Worst classes on", configs, key="drill_config")
    worst = aggregate.per_class_accuracy(entry, config).head(15)
    st.dataframe(worst[["class", "acc1", "n"]], hide_index=True, key="worst_classes",
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
    st.dataframe(pd.DataFrame({"field": list(prov), "value": [str(v) for v in prov.values()]}), hide_index=True,
                 key="provenance")
    if r.get("notes"):
        st.text("notes: " + str(r["notes"]))


def _rejected(store: Store) -> None:
    rows = [{"entry": str(e.path.relative_to(store.root)) if store.root in e.path.parents else str(e.path),
             "status": e.status, "reason": e.reason} for e in store.rejected + store.superseded]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="rejected")
    else:
        st.text("No rejected or superseded entries.")


main()
