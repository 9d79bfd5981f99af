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
from genshift.eval.inference import Forward, InferenceOptions


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
    opts = InferenceOptions(batch_size=2, workers=0, compile="off", channels_last=False, forward_threads=threads)
    return Forward(model, opts, n_images=8)


def test_batches_of_a_unit_are_in_flight_at_once_each_at_the_intra_op_thread_count():
    x, labels = torch.randn(8, 3, 2, 2), torch.arange(8)
    model = _Meeting(parties=2, timeout=30)
    fwd = _forward(model, threads=2)
    outs = fwd.map(x, labels)
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
    assert InferenceOptions().resolved_forward_threads() == 8
    assert InferenceOptions(cpu_threads=2).resolved_forward_threads() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun / accelerate: four processes share the cores
    assert InferenceOptions().resolved_forward_threads() == 2
    assert InferenceOptions(forward_threads=3).resolved_forward_threads() == 3
    assert InferenceOptions(device="cuda", forward_threads=3).resolved_forward_threads() == 1


def _eval(tmp_path, suite, weights, name, *extra):
    out = tmp_path / name
    code = main(["eval", "--model", "tf_efficientnet_lite0", "--checkpoint", weights, "--remap-by-order",
                 "--suite", str(suite), "--out", str(out), "--workers", "0", "--no-progress", "--compile", "off",
                 "--batch-size", "4", *extra])
    assert code == 0
    result = json.loads(next(out.rglob("result.json")).read_text())
    files = {p.name: p.read_bytes() for p in sorted(out.rglob("predictions/*.parquet"))}
    return result, files


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
