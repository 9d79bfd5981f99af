"""``bench eval`` end to end: open + verify the suite, load the model, predict every config,
score, and write the result with full provenance.

Output layout (``--out``, default ``runs/``)::

    runs/<suite id>/<model slug>/result.json
    runs/<suite id>/<model slug>/predictions/<config>.parquet
    runs/<suite id>/<model slug>/.work/            units of an unfinished run + job.json (removed at the end)
    runs/<suite id>/<model slug>/failure.json      a model that failed in a sweep (removed by the rerun)

A killed run resumes from its last flushed units; a finished run is a no-op unless ``force``.
Scoring many models at once, and in many processes, is ``genshift.eval.sweep``; ``evaluate`` is its
one-model case. Opening the suite is ``genshift.eval.suite_open`` (shared with the sweep).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from genshift.errors import BenchError
from genshift.eval.inference import InferenceOptions
from genshift.eval.results import RESULT_FILE
from genshift.eval.scoring import ScoringOptions
from genshift.eval.sweep import ModelSpec, SweepRequest, run_sweep


@dataclass(frozen=True)
class EvalRequest:
    """Everything ``bench eval`` was asked to do."""

    model: str
    suite: str
    configs: tuple[str, ...] | None = None
    revision: str | None = None
    checkpoint: str | None = None
    remap_by_order: bool = False
    checkpoint_weights: str = "model"   # "model" | "ema": which weights of a training checkpoint
    preprocess: str = "timm"       # genshift.eval.models.PREPROCESS
    mask: str | None = None
    out: str = "runs"
    force: bool = False
    inference: InferenceOptions = field(default_factory=InferenceOptions)
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    notes: str = ""


def evaluate(req: EvalRequest, *, progress: bool = True) -> tuple[dict, Path]:
    """Run (or resume) an evaluation and return ``(result, result_path)``: a sweep of one model
    (``genshift.eval.sweep``), so a model scored alone and in a sweep gets the same files."""
    from genshift.eval.models import parse_model_name

    parse_model_name(req.model)  # a typo in --model is reported before any suite download
    # every other field means the same in both requests: copied by name, so a new option cannot be dropped here
    same = {f.name: getattr(req, f.name) for f in fields(EvalRequest) if f.name not in ("model", "checkpoint")}
    jobs = run_sweep(SweepRequest(models=(ModelSpec(req.model, req.checkpoint),), **same), progress=progress)
    job = jobs[0]
    if job.result is None:  # distributed: another process builds the result
        raise BenchError(f"{job.model_id}: this process's units are done; the result is built by the last process "
                         "to finish (or `bench eval --merge OUT`)")
    return job.result, job.run_dir / RESULT_FILE
