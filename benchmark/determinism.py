"""The one CPU thread setting that decides bytes: eval's forward passes and the builders' model steps.

CPU kernels (matmul, convolution) sum in an order that depends on the number of intra-op threads, so
a run that must give the same bytes anywhere fixes that number for its model steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``; the previous count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
