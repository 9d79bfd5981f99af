"""One normal form of a model id, wherever ids from different places are matched (results CSVs,
populations, the board's ID axis, construction flags)."""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^(hf-hub:|hf_hub:)?(timm/)?")


def model_key(model_id: str) -> str:
    """The bare timm name of a model id, as timm's results CSVs and the populations name models.

    ``timm/<arch.tag>``, ``hf-hub:timm/<arch.tag>@<sha>`` and ``<arch.tag>`` all give
    ``<arch.tag>``; a non-timm Hub repo keeps its ``org/name`` (without ``hf-hub:`` and revision).

    >>> model_key("hf-hub:timm/resnet50.a1_in1k@0123abc"), model_key("timm/resnet50.a1_in1k")
    ('resnet50.a1_in1k', 'resnet50.a1_in1k')
    >>> model_key("hf-hub:someone/net@main")
    'someone/net'
    """
    return _PREFIX.sub("", model_id.strip()).split("@", 1)[0]
