"""The ImageNet-1k label space and its WordNet 3.0 hierarchy (package data made by
``scripts/make_imagenet_hierarchy.py``; WordNet under ``benchmark/_data/WORDNET_LICENSE``). Indices are the standard
ones (wnids in sorted order, as in timm and torchvision). Names are open_clip's "clean" names, two of them duplicated
("missile" 657/744, "sunglasses" 836/837): every lookup goes through indices or wnids, never names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from genshift.errors import BenchError, unknown

NUM_CLASSES = 1000


@dataclass(frozen=True)
class ImageNetClass:
    """One class; ``parent``: the IN-G prompt parent (Wiles et al.: the grandparent with the smallest offset);
    ``ancestors``: the full hypernym closure."""

    index: int
    wnid: str
    name: str
    lemma: str
    lemmas: tuple[str, ...]
    hypernyms: tuple[str, ...]
    ancestors: tuple[str, ...]
    grandparents: tuple[str, ...]
    parent: str | None
    fd_ancestor: str | None


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(resources.files("genshift").joinpath("_data", "imagenet_hierarchy.json").read_bytes())


@lru_cache(maxsize=1)
def classes() -> tuple[ImageNetClass, ...]:
    return tuple(ImageNetClass(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
                 for c in _data()["classes"])


@lru_cache(maxsize=1)
def wnids() -> tuple[str, ...]:
    return tuple(c.wnid for c in classes())


@lru_cache(maxsize=1)
def names() -> tuple[str, ...]:
    return tuple(c.name for c in classes())


@lru_cache(maxsize=1)
def _wnid_to_index() -> dict[str, int]:
    return {c.wnid: c.index for c in classes()}


def index_of(wnid: str) -> int:
    """Class index of an ImageNet-1k wnid (``n01440764`` -> 0)."""
    try:
        return _wnid_to_index()[wnid]
    except KeyError:
        raise unknown("ImageNet-1k wnid", wnid, (), hint="Wnids look like 'n01440764' "
                      "and must be one of the 1000 ImageNet-1k classes.") from None


def parse_class(text: str) -> int:
    """A class as a user writes it, an index (``"283"``) or a wnid (``"n02123394"``) -> its index."""
    text = str(text).strip()
    if text.isdigit():
        if not 0 <= int(text) < NUM_CLASSES:
            raise BenchError(f"class {text} is not an ImageNet-1k index (0..999)")
        return int(text)
    return index_of(text)


def get_class(index: int) -> ImageNetClass:
    if not 0 <= int(index) < NUM_CLASSES:
        raise ValueError(f"ImageNet-1k class index must be in 0..999, got {index}")
    return classes()[int(index)]


def synset_name(wnid: str) -> str:
    """Readable name (first lemma) of any synset referenced by the hierarchy."""
    syn = _data()["synsets"]
    if wnid in syn:
        return syn[wnid]["name"]
    if wnid in _wnid_to_index():
        return classes()[_wnid_to_index()[wnid]].lemma
    raise unknown("synset", wnid, (), hint="It is not an ImageNet-1k class or one of their ancestors.")


def is_under(index: int, synset: str) -> bool:
    """True iff class ``index`` is ``synset`` or has it in its hypernym closure."""
    c = get_class(index)
    return c.wnid == synset or synset in c.ancestors


@lru_cache(maxsize=1)
def parent_membership() -> np.ndarray:
    """``M[y, c]``: class ``c`` is under the IN-G parent of class ``y`` (a class without a parent: itself only)."""
    cls = classes()
    anc = [set(c.ancestors) | {c.wnid} for c in cls]
    m = np.zeros((NUM_CLASSES, NUM_CLASSES), dtype=bool)
    for y, cy in enumerate(cls):
        m[y] = [cy.parent in a for a in anc] if cy.parent is not None else np.arange(NUM_CLASSES) == y
    m.setflags(write=False)
    return m


@lru_cache(maxsize=1)
def imagenet_a_indices() -> tuple[int, ...]:
    """The 200 ImageNet-A classes as ImageNet-1k indices, sorted."""
    return tuple(_data()["imagenet_a"])

