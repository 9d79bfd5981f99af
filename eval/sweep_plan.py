"""``bench eval --plan``: the sweep's models, preprocessing groups, work items per process and an
estimated cost measured on a probe; nothing is written."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from genshift.determinism import fixed_threads
from genshift.eval.inference import Forward, plan_units, process_cores
from genshift.eval.predictions import CARRIED_COLUMNS
from genshift.eval.results import path_slug
from genshift.eval.suite_open import open_suite
from genshift.eval.sweep import Job, Sweep, SweepRequest, load_model, unit_digests


def plan(req: SweepRequest, *, probe: bool = True) -> dict:
    """``bench eval --plan``: groups, work items per process and an estimated cost, measured on a
    probe (one unit decoded, one batch through each model) — nothing is written."""
    sw = Sweep(req, progress=False)
    sw.dist.is_main = False  # claim nothing
    sw.info = open_suite(req.suite, revision=req.revision, configs=req.configs, mask=req.mask)
    sw.suite = sw.info.suite
    sw.configs = sw.suite.select(list(req.configs) if req.configs else None)
    sw.units = {c: plan_units(sw.suite, c, batch_size=sw.opts.resolved_batch_size(), unit_rows=sw.opts.unit_rows,
                              limit_per_class=sw.opts.limit_per_class) for c in sw.configs}
    sw.unit_ids = {c: unit_digests(sw.suite, c, *sw.units[c]) for c in sw.configs}
    sw.out = Path(req.out)
    sw.suite_dir = sw.out / path_slug(sw.suite.suite_id)
    for spec in req.models:
        sw._prepare_job(spec)
    items = sw.items()
    with fixed_threads(sw.opts.cpu_threads):  # measured at the thread count the run will use
        rates = measure_rates(sw) if probe else {"decode_s_per_image": {}, "forward_s_per_image": {}}
    decode_s, forward_s = [0.0] * sw.dist.world, [0.0] * sw.dist.world
    groups = {}
    for it in items:
        g = groups.setdefault(it["group"], {"models": set(), "decodes": 0, "model_images": 0})
        g["models"].update(it["models"])
        g["decodes"] += it["rows"]
        g["model_images"] += it["cost"]
        decode_s[it["rank"]] += it["rows"] * rates["decode_s_per_image"].get(it["group"], 0.0)
        forward_s[it["rank"]] += it["rows"] * sum(rates["forward_s_per_image"].get(m, 0.0) for m in it["models"])
    per_rank = [d + f for d, f in zip(decode_s, forward_s)]
    busy = [overlapped_seconds(d, f, sw.opts) for d, f in zip(decode_s, forward_s)]
    return {
        "models": [{"model": j.model_id, "status": j.status, "group": j.state.get("group"), "error": j.error}
                   for j in sw.jobs],
        "groups": {k: {**v, "models": sorted(v["models"])} for k, v in groups.items()},
        "items": items, "processes": sw.dist.world,
        "rates": rates,
        "estimated_seconds": round(max(per_rank), 1) if items and probe else None,
        "estimated_seconds_per_process": [round(s, 1) for s in per_rank] if probe else None,
        "estimated_seconds_all_busy": round(max(busy), 1) if items and probe else None,
    }


def overlapped_seconds(decode_s: float, forward_s: float, opts) -> float:
    """A process's decode and forward time (seconds of one core or of the device, from the probe) when
    they overlap fully: on CPU the decode workers, forward threads and groups in flight share the
    process's cores, so all the work over them; on a GPU the longer of the decode workers' share and
    the device's forward passes. A lower bound: ``estimated_seconds`` (nothing overlapped) is the upper."""
    if opts.device.startswith("cpu"):
        return (decode_s + forward_s) / process_cores()
    return max(decode_s / max(1, opts.resolved_workers()), forward_s)


def measure_rates(sw: Sweep) -> dict:
    """Seconds per image: decode+transform of one unit per preprocessing group, and each model's
    forward pass on one batch of its group's images (after a warm-up batch)."""
    import torch

    from genshift.eval.inference import UnitDataset, make_transform

    rates = {"decode_s_per_image": {}, "forward_s_per_image": {}}
    todo = [j for j in sw.jobs if j.status == "todo"]
    if not todo or not sw.configs or not sw.units[sw.configs[0]][1]:
        return rates
    groups, units = sw.units[sw.configs[0]]
    carried = tuple(x for x in CARRIED_COLUMNS if x in sw.suite.manifest.features)
    bs = sw.opts.resolved_batch_size()
    by_group: dict[str, list[Job]] = {}
    for j in todo:
        by_group.setdefault(j.group_key, []).append(j)
    for key, jobs in sorted(by_group.items()):
        ds = UnitDataset(sw.suite.root, groups, units[:1], make_transform(jobs[0].state["data_config"],
                                                                          uint8=sw.opts.device_normalizes()), carried)
        t0 = time.perf_counter()
        item = ds[0]
        rates["decode_s_per_image"][key] = (time.perf_counter() - t0) / max(1, len(item["meta"]["image_id"]))
        x = item["x"][:bs]
        labels = torch.tensor(item["meta"]["label"][:bs], dtype=torch.long)
        for job in jobs:
            clf = job.clf or load_model(sw.req, job.spec)
            fwd = Forward(clf.model, replace(sw.opts, compile="off"), n_images=0, data_config=job.state["data_config"])
            fwd(x, labels)  # warm-up
            t0 = time.perf_counter()
            fwd(x, labels)
            rates["forward_s_per_image"][job.model_id] = (time.perf_counter() - t0) / max(1, x.shape[0])
    return rates
