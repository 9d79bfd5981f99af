"""Where a sweep's time went: how busy the models and the decode workers were, and how long each
waited for the other, from the timeline ``genshift.eval.inference.predict_units`` records.

One event per streamed unit (``perf_counter`` seconds; on Linux CLOCK_MONOTONIC, one clock for
the main process and its DataLoader workers)::

    {"chunk": 0, "config": "base", "unit": 3, "loader_started": t,
     "decoded": (start, end, worker pid), "waited": (asked, got), "forward": {model: (start, end)}}

- *model busy*: the sum of the forward spans over the wall time, i.e. the mean number of models
  computing at once (above 1 when groups overlap);
- *decode busy*: the sum of the decode spans (read, decode, transform of a unit) over the wall
  time, i.e. the mean number of workers decoding;
- *model waits*: time the sweep's loops were blocked waiting for a decoded unit;
- *worker waits*: a worker's idle gaps between two units of one loader (the prefetch queue was
  full: the models had not taken the units it had already decoded);
- *loader start*: from creating a loader to its first unit's decode starting (worker start-up).
"""

from __future__ import annotations


def busy_shares(timeline: list[dict], wall: float) -> dict:
    """Totals and shares of ``wall`` seconds (see the module docstring); empty timeline: zeros."""
    forward = sum(b - a for e in timeline for a, b in e["forward"].values())
    decode = sum(e["decoded"][1] - e["decoded"][0] for e in timeline)
    model_wait = sum(e["waited"][1] - e["waited"][0] for e in timeline)
    worker_wait = loader_start = 0.0
    loaders: dict[tuple, list[dict]] = {}
    for e in timeline:
        loaders.setdefault((e.get("chunk"), e["config"], e["loader_started"]), []).append(e)
    for (_, _, started), events in loaders.items():
        loader_start += min(e["decoded"][0] for e in events) - started
        by_worker: dict[int, list[tuple[float, float]]] = {}
        for e in events:
            by_worker.setdefault(e["decoded"][2], []).append(e["decoded"][:2])
        for spans in by_worker.values():
            spans.sort()
            worker_wait += sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    wall = max(wall, 1e-9)
    return {
        "wall_s": round(wall, 3), "units": len(timeline), "loaders": len(loaders),
        "model_s": round(forward, 3), "decode_s": round(decode, 3),
        "model_wait_s": round(model_wait, 3), "worker_wait_s": round(worker_wait, 3),
        "loader_start_s": round(loader_start, 3),
        "model_busy": round(forward / wall, 3), "decode_busy": round(decode / wall, 3),
        "model_wait_share": round(model_wait / wall, 3),
    }


def chunk_spans(timeline: list[dict]) -> dict[int, dict]:
    """Per chunk: when its first unit's decode started and when its last forward ended."""
    out: dict[int, dict] = {}
    for e in timeline:
        c = out.setdefault(e["chunk"], {"first_decode": float("inf"), "last_forward_end": 0.0})
        c["first_decode"] = min(c["first_decode"], e["decoded"][0])
        c["last_forward_end"] = max([c["last_forward_end"], *(b for _, b in e["forward"].values())])
    return out
