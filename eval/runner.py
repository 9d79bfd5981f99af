"""The library's way in: ``genshift.evaluate``, its :class:`Result`, ``genshift.verify`` and ``genshift.slope``;
``bench eval`` runs the same code (``genshift.eval.sweep``). What ``out`` holds: docs/results.md; ``out=None``
runs in a temporary folder that is removed (the :class:`Result` holds the predictions' bytes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from genshift.errors import BenchError
from genshift.eval.options import EvalOptions, ModelSpec, OptionError, resolve_models


@dataclass(frozen=True)
class Result:
    """One evaluation's result: ``record`` has the schema of ``result.json`` (``docs/results.md``),
    ``path`` is that file when the call wrote one."""

    record: Mapping
    path: Path | None = None
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # config -> predictions (out=None)

    model = property(lambda self: self.record["model"])
    suite = property(lambda self: self.record["suite"])
    protocol = property(lambda self: self.record["protocol"])
    run = property(lambda self: self.record["run"])
    metrics = property(lambda self: self.record["metrics"])
    counts = property(lambda self: self.record["counts"])
    flags = property(lambda self: self.record["flags"])
    config_hash = property(lambda self: self.record["config_hash"])

    def predictions_bytes(self, config: str) -> bytes:
        """The bytes of ``predictions/<config>.parquet``."""
        if config in self.files:
            return self.files[config]
        if self.path is None or config not in self.suite["configs"]:
            raise BenchError(f"no predictions of config {config!r}; the result has {', '.join(self.suite['configs'])}")
        return (self.path.parent / "predictions" / f"{config}.parquet").read_bytes()

    def predictions(self, config: str):
        """Config ``config``'s per-image predictions as a pyarrow Table (``genshift.eval.predictions``)."""
        from genshift.eval.predictions import read_predictions

        return read_predictions(f"predictions/{config}.parquet", data=self.predictions_bytes(config))


@contextmanager
def _given_back(model):
    """A caller's module handed back as it came (evaluation puts it in eval mode, on the device,
    channels-last): its mode, device and memory format."""
    import torch

    params = list(model.parameters())
    training, device = model.training, params[0].device if params else None
    contiguous = all(p.is_contiguous() for p in params)
    try:
        yield
    finally:
        model.train(training)
        if device is not None:
            model.to(device)
        if contiguous:
            model.to(memory_format=torch.contiguous_format)


def evaluate(model, suite: str, *, configs: Sequence[str] | None = None, out: str | Path | None = None,
             options: EvalOptions | None = None, model_id: str | None = None, data_config: dict | None = None,
             transform=None, **option_overrides) -> Result:
    """Score ``model`` (a name as ``--model`` takes it, or an ``nn.Module`` holding its weights with
    ``model_id``, ``data_config`` or ``transform``: README, "In Python") on ``suite`` (a registry id, a Hub
    dataset repo or a suite folder); ``options`` and ``option_overrides`` (any field of :class:`EvalOptions`,
    e.g. ``topk=5``) say how."""
    from genshift.eval.results import RESULT_FILE
    from genshift.eval.sweep import SweepRequest, run_sweep

    opts = EvalOptions.build(options, **option_overrides)
    module = not isinstance(model, str)
    if not module:
        if model_id is not None or data_config is not None or transform is not None:
            raise OptionError("model_id", "model_id, data_config and transform go with a module; a named model "
                                          "brings its own")
        specs, _ = resolve_models([model])
        if len(specs) != 1:
            raise OptionError("model", f"model {model!r} names {len(specs)} models; evaluate scores one "
                                       "(genshift.eval.sweep.run_sweep scores a list)")
        spec = specs[0]
    else:
        from genshift.eval.models import LoadedClassifier

        if transform is not None:  # the module's transform normalises: workers ship its floats
            if opts.decode == "device":
                raise OptionError("decode", "decode=device decodes with timm's geometry; a module with its own "
                                            "transform needs decode=cpu")
            opts = replace(opts, normalize_on_device=False)
        clf = LoadedClassifier.from_module(model, model_id=model_id, data_config=data_config, transform=transform,
                                           preprocess=opts.preprocess)
        spec = ModelSpec(clf.model_id, classifier=clf)
    configs = (configs,) if isinstance(configs, str) else tuple(configs) if configs else None
    where = tempfile.TemporaryDirectory(prefix="genshift-eval-") if out is None else nullcontext(out)
    with where as folder, _given_back(model) if module else nullcontext():
        job = run_sweep(SweepRequest(models=(spec,), suite=str(suite), configs=configs, out=str(folder),
                                     options=opts))[0]
        if job.result is None:  # distributed: another process builds the result
            raise BenchError(f"{job.model_id}: this process's units are done; the result is built by the last "
                             "process to finish (or `bench eval --merge OUT`)")
        if out is not None:
            return Result(job.result, job.run_dir / RESULT_FILE)
        files = {p["config"]: (job.run_dir / p["path"]).read_bytes() for p in job.result["predictions"]}
        return Result(job.result, None, files)


def verify(result: Result | str | Path, *, suite: str | None = None, **kwargs):
    """``bench verify``: check a result against its suite and recompute every metric
    (``genshift.eval.verify.verify_result``; ``recheck=N`` re-runs N images). Returns its report."""
    from genshift.eval.verify import verify_result

    if isinstance(result, Result):
        if result.path is None:
            raise BenchError("this result was made with out=None and its files are gone; evaluate with out=FOLDER "
                             "to verify it")
        result = result.path
    return verify_result(result, suite=suite, **kwargs)


def slope(results: Sequence[Result | Mapping | str | Path], **kwargs) -> dict:
    """``bench slope``: per shift, the ID/OOD fit across models, effective robustness and the
    shift's impact (``genshift.eval.slope.slope_table``)."""
    from genshift.eval.results import load_result
    from genshift.eval.slope import slope_table
    from genshift.eval.verify import result_path

    records = [dict(r.record) if isinstance(r, Result) else r if isinstance(r, Mapping) else
               load_result(result_path(r)) for r in results]
    return slope_table(records, **kwargs)
