"""Peak memory of a pass on the meta device, and the same measurement on a GPU (``Probe``).

On meta nothing is allocated, but every tensor has a size: ``LiveBytes`` (a dispatch mode) adds
up the storages alive at once, from the moment the models are built (their weights are counted
from the modules, at their dtype). Scaled-dot-product attention is counted as the fused kernel a
device runs (``FusedAttention``: the output, q/k/v kept for the backward, no L x S matrix); on
meta it would otherwise decompose into the math path. On a CUDA device ``Probe`` reads the
allocator's peak and the clock instead.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from genshift.builders.real_models import param_count

GiB = 2 ** 30




class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages alive at once among those created inside the mode.

    A storage is alive while anything but this tracker holds it (a tensor, a view, a parameter, a
    tensor autograd saved for the backward): its use count, read whenever the running total would
    pass the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.active = True  # off while models are built (their weights are counted from the modules)
        self._storages: dict[int, tuple[torch.UntypedStorage, int]] = {}

    def _sweep(self) -> None:
        dead = [k for k in self._storages if torch._C._storage_Use_Count(k) <= 1]  # only our reference left
        for k in dead:
            self.live -= self._storages.pop(k)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.active:
            return out
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                # a view or an in-place result shares a storage it was given: nothing new allocated
                if storage._cdata not in self._storages and storage._cdata not in given:
                    self._storages[storage._cdata] = (storage, storage.nbytes())
                    self.live += storage.nbytes()  # an upper bound until swept
                    if self.live > self.peak:  # a new peak only if it survives a sweep
                        self._sweep()
                        self.peak = max(self.peak, self.live)
        return out


class _Fused(torch.autograd.Function):
    """A fused attention kernel's footprint: the output; q, k, v saved for the backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` as a fused kernel: the output, no probability matrix.

    (On meta, SDPA decomposes into the math path and would count an L x S matrix per head that
    flash / memory-efficient / CPU-flash kernels never hold.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
                raise RuntimeError(f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                                   f"v {tuple(v.shape)}")
            return _Fused.apply(q, k, v)
        return func(*args, **kwargs)


class Probe:
    """Where a stage's pass starts (models built): memory and time are taken from there on.

    On meta, the live-bytes peak restarts at the built weights; on a GPU, the allocator's peak
    statistics and the clock restart."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.mem = LiveBytes() if device == "meta" else None
        if self.mem is not None:
            self.mem.active = False
        self.params: dict[str, int] = {}
        self.total = 0
        self.weights = 0
        self.t0 = 0.0

    @contextmanager
    def watching(self):
        if self.mem is None:
            yield self
            return
        with FusedAttention(), self.mem:
            yield self

    def built(self, **models: torch.nn.Module) -> None:
        """The models are built: record their parameters (as published, before any token is added)."""
        self.params = {k: param_count(m) for k, m in models.items()}
        self.total = param_count(*models.values())
        self.weights = weight_bytes(*models.values())
        if self.mem is not None:
            self.mem.active = True
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.t0 = time.perf_counter()

    def seconds(self) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0

    @property
    def peak(self) -> int:
        """Weights + the activation peak of the pass (bytes)."""
        if self.mem is None:
            return torch.cuda.max_memory_allocated(self.device)
        return self.weights + self.mem.peak


def weight_bytes(*modules: torch.nn.Module) -> int:
    seen = {}
    for m in modules:
        for t in [*m.parameters(), *m.buffers()]:
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())
