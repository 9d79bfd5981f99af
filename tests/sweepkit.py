"""Shared pieces of the sweep tests (tests/test_sweep_*.py): three tiny random-weight timm models saved
as checkpoints (so every load is the same model), a small synthetic suite, and each model scored
alone, the reference bytes every sweep must write."""

import os
import sys
from pathlib import Path

import pytest

from genshift import evaluate
from genshift.distributed import Process
from genshift.eval.options import EvalOptions, ModelSpec
from genshift.eval.sweep import SweepRequest, run_sweep

ARCHS = ("test_convnext.r160_in1k", "test_vit.r160_in1k", "test_resnet.r160_in1k")  # 2 + 1 share a data config
FOLDER: dict[str, str] = {}  # arch -> the run folder of its zoo weights (genshift.identity.folder_name), set by zoo
OPTS = dict(batch_size=4, workers=0, compile="off", unit_rows=4, progress=False)
CLI_OPTS = ["--workers", "0", "--batch-size", "4", "--compile", "off", "--no-progress"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Random weights of three tiny 1000-class timm models, as safetensors."""
    import timm
    import torch
    from safetensors.torch import save_file

    from genshift.identity import canonical_id, folder_name, tensors_sha256

    d = tmp_path_factory.mktemp("zoo")
    out = {}
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(i)
        m = timm.create_model(arch, pretrained=False)
        out[arch] = d / f"{arch}.safetensors"
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(out[arch]))
        FOLDER[arch] = folder_name(canonical_id(source="checkpoint", name=arch.split(".")[0],
                                                tensors_sha256=tensors_sha256(m.state_dict())))
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from genshift.synthetic import make_synthetic_suite

    root = tmp_path_factory.mktemp("s") / "toy"
    make_synthetic_suite(root, configs=("base", "shifted"), classes=range(6), per_class=3, num_shards=2)
    return root


@pytest.fixture(scope="module")
def singles(tmp_path_factory, suite, zoo):
    """Each model scored alone by the library's entry point: the reference bytes."""
    out = tmp_path_factory.mktemp("single")
    for a in ARCHS:
        evaluate(f"{a}={zoo[a]}", str(suite), out=out, **OPTS)
    return out


def files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(Path(out).rglob("predictions/*.parquet"))}


def sweep(out, suite, zoo, archs=ARCHS, **options):
    return run_sweep(SweepRequest(models=tuple(ModelSpec(a, str(zoo[a])) for a in archs), suite=str(suite),
                                  out=str(out), options=EvalOptions(**{**OPTS, **options})))


def cli(*args):
    """``bench eval ARGS`` as a new process: (environment, command)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "TQDM_DISABLE": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return env, [sys.executable, "-m", "genshift", "eval", *args]


def fake_world(monkeypatch, world: int, rank: int) -> None:
    """This process as process ``rank`` of ``world`` (no process group: the others are earlier or later calls)."""
    from genshift.eval import sweep as module

    monkeypatch.setattr(module, "current_process", lambda device=None: Process(rank, world, rank))


def flush_every_unit(init):
    def wrapped(self, *a, **kw):
        kw["flush_rows"] = 1
        init(self, *a, **kw)
    return wrapped
