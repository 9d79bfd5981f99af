"""Forward threads: several batches of one model computed at once on CPU, bytes of a one-thread run.

CPU kernels' reduction order depends on the intra-op thread count, so ``--cpu-threads`` stays the
number that decides the bytes; ``--forward-threads`` puts more cores to work by running whole
batches side by side, each at ``--cpu-threads``.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from genshift.cli import main
from genshift.eval.inference import COMPILE_MIN_IMAGES, Forward, wants_compile
from genshift.eval.options import EvalOptions


class _Meeting(torch.nn.Module):
    """A model whose forward waits until ``parties`` forwards are inside it at the same time."""

    def __init__(self, parties: int, timeout: float) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=timeout)
        self.fc = torch.nn.Linear(4, 1000)
        self.threads: set[int] = set()
        self.intra_op: set[int] = set()

    def forward(self, x):
        self.threads.add(threading.get_ident())
        self.intra_op.add(torch.get_num_threads())
        self.barrier.wait()
        return self.fc(x.flatten(1)[:, :4])


def _forward(model, threads):
    opts = EvalOptions(batch_size=2, workers=0, compile="off", channels_last=False, forward_threads=threads)
    return Forward(model, opts, compile=False)


def test_batches_of_a_unit_are_in_flight_at_once_each_at_the_intra_op_thread_count():
    x, labels = torch.randn(8, 3, 2, 2), torch.arange(8)
    model = _Meeting(parties=2, timeout=30)
    fwd = _forward(model, threads=2)
    outs = fwd.map(x, labels)
    fwd.close()  # the pool is the Forward's own: its threads end with it
    assert not any(t.name.startswith("forward") for t in threading.enumerate())
    # four batches of two, in order; two forwards met inside the model, so they ran at the same time
    assert [o[0].shape[0] for o in outs] == [2, 2, 2, 2]
    assert len(model.threads) == 2 and fwd.thread_ids == model.threads
    assert model.intra_op == {1}  # every batch at --cpu-threads (1), not at the machine's count
    # one thread: the same forwards one after another never meet (the barrier gives up)
    alone = _Meeting(parties=2, timeout=0.5)
    with pytest.raises(threading.BrokenBarrierError):
        _forward(alone, threads=1).map(x, labels)


def test_threads_are_the_process_share_of_the_cores_on_cpu_and_one_on_a_gpu(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert EvalOptions().resolved_forward_threads() == 8
    assert EvalOptions(cpu_threads=2).resolved_forward_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun / accelerate: four processes share the cores
    assert EvalOptions().resolved_forward_threads() == 2
    assert EvalOptions(forward_threads=3).resolved_forward_threads() == 3
    assert EvalOptions(device="cuda", forward_threads=3).resolved_forward_threads() == 1
    assert EvalOptions(forward_threads=3).resolved_forward_threads(compiled=True) == 1  # a compiled model: one


def test_compile_auto_decides_from_the_request_alone():
    """auto compiles long runs on a GPU only: the same request runs the same numerics on any machine."""
    assert not wants_compile(EvalOptions(), n_images=10**6)
    assert not wants_compile(EvalOptions(device="cuda"), n_images=COMPILE_MIN_IMAGES - 1)
    assert wants_compile(EvalOptions(device="cuda"), n_images=COMPILE_MIN_IMAGES)
    assert wants_compile(EvalOptions(compile="on"), n_images=1) and not wants_compile(
        EvalOptions(device="cuda", compile="off"), n_images=10**6)


def _eval(tmp_path, suite, weights, name, *extra):
    out = tmp_path / name
    code = main(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", weights, "--remap-by-order",
                 "--suite", str(suite), "--out", str(out), "--workers", "0", "--no-progress", "--compile", "off",
                 "--batch-size", "4", *extra])
    assert code == 0
    result = json.loads(next(out.rglob("result.json")).read_text())
    files = {p.name: p.read_bytes() for p in sorted(out.rglob("predictions/*.parquet"))}
    return result, files


@pytest.mark.slow
def test_real_weights_give_the_same_bytes_on_one_and_two_forward_threads(tmp_path, lite0_weights):
    from genshift.synthetic import make_synthetic_suite

    suite = tmp_path / "toy"
    make_synthetic_suite(suite, configs=("base",), classes=range(6), per_class=4, image_size=96)
    one, one_files = _eval(tmp_path, suite, lite0_weights, "one", "--forward-threads", "1")
    two, two_files = _eval(tmp_path, suite, lite0_weights, "two", "--forward-threads", "2")
    assert one["run"]["forward_threads"] == 1 and two["run"]["forward_threads"] == 2
    # the evidence: batches of the two-thread run were computed on two threads
    assert one["run"]["timings"]["base"]["forward_threads_used"] == 1
    assert two["run"]["timings"]["base"]["forward_threads_used"] == 2
    assert one_files == two_files and one["predictions"] == two["predictions"]
    # the comparison can fail: two intra-op threads change the last bits with these weights
    _, intra_two = _eval(tmp_path, suite, lite0_weights, "intra", "--forward-threads", "1", "--cpu-threads", "2")
    assert intra_two != one_files
