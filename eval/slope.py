"""ID/OOD lines across models, from result records (``bench slope``; reused by the leaderboard).

For each shift config, regress the models' shift accuracy on their in-distribution accuracy
(``eval.metrics.id_ood_fit``, linear and probit). The ID axis is the suite's reference config
(ImageNet* ``base``) by default, or accuracies given per model (e.g. ImageNet-val top-1 from a
pinned timm results CSV).
"""

from __future__ import annotations

from benchmark.errors import BenchError
from eval.metrics import id_ood_fit

SCALES = ("linear", "probit")


def _acc1(result: dict, config: str) -> float | None:
    m = result["metrics"]["configs"].get(config)
    return None if m is None else m["acc1"]["value"]


def slope_table(results: list[dict], *, reference_config: str | None = None,
                id_accuracy: dict[str, float] | None = None, scales: tuple[str, ...] = SCALES) -> dict:
    """Per shift: the fit on each scale and each model's effective robustness.

    All results must be of one suite (same manifest hash) and one scoring protocol, else the
    points are not comparable and a ``BenchError`` names the odd one out.
    """
    if len(results) < 2:
        raise BenchError(f"an ID/OOD fit needs results of at least 2 models, got {len(results)}")
    first = results[0]
    for r in results[1:]:
        for key, what in ((("suite", "manifest_sha256"), "suite data (manifest hash)"),
                          (("protocol", "scoring"), "scoring protocol")):
            if r[key[0]][key[1]] != first[key[0]][key[1]]:
                raise BenchError(f"result of {r['model']['id']} uses another {what} than {first['model']['id']}; "
                                 "fit only results of the same suite revision and protocol")
    models = [r["model"]["id"] for r in results]
    if len(set(models)) != len(models):
        raise BenchError("two results of the same model; keep one per model")
    ref = reference_config or first["protocol"]["scoring"].get("reference_config") or "base"
    if id_accuracy is not None:
        missing = [m for m in models if m not in id_accuracy]
        if missing:
            raise BenchError(f"no in-distribution accuracy given for {missing[0]!r}")
        x = [float(id_accuracy[m]) for m in models]
        id_desc = "given"
    else:
        x = [_acc1(r, ref) for r in results]
        if any(v is None for v in x):
            raise BenchError(f"reference config {ref!r} is missing from some results; evaluate it or give ID accuracies")
        id_desc = f"config {ref}"
    shifts = sorted(set.intersection(*(set(r["metrics"]["configs"]) for r in results)) - {ref})
    table = {}
    for s in shifts:
        y = [_acc1(r, s) for r in results]
        keep = [i for i, v in enumerate(y) if v is not None]
        table[s] = {scale: {**id_ood_fit([x[i] for i in keep], [y[i] for i in keep], scale=scale),
                            "models": [models[i] for i in keep]} for scale in scales}
    return {"id_axis": id_desc, "models": models, "id_accuracy": x, "shifts": table}
