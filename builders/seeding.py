"""Deterministic seeds for every generated item: a hash of the suite seed and the item's ids, independent
of the order, batching and sharding of the work."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SEED_BITS = 63


def derive_seed(root_seed: int, *ids: str | int) -> int:
    """``sha256("root|id1|id2|...")`` truncated to a non-negative 63-bit integer.

    >>> derive_seed(0, "base", 7, 3) == derive_seed(0, "base", 7, 3)
    True
    >>> derive_seed(0, "base", 7, 3) != derive_seed(0, "base", 7, 4)
    True
    """
    text = "|".join([str(int(root_seed)), *(str(i) for i in ids)])
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << SEED_BITS) - 1)


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded with ``seed`` (one per item; never global state)."""
    import torch

    return torch.Generator(device=device).manual_seed(int(seed))
