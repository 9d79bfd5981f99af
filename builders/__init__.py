"""Builders: regenerate each benchmark family in the suite format (``docs/builders.md``).

A builder module, registered here by suite id (imported only when it runs), provides ``Config`` (a
frozen :class:`genshift.builders.common.BuildConfig`) and ``run(cfg) -> int``; ``bench build`` derives
its flags from ``Config``.
"""

from __future__ import annotations

from genshift.registry import Registry

BUILDERS: Registry[str] = Registry("builder")  # suite id -> module path
BUILDERS.register("imagenet-star", "genshift.builders.imagenet_star")
BUILDERS.register("lance-hardimagenet", "genshift.builders.lance")
BUILDERS.register("in-g-rn", "genshift.builders.in_g")
BUILDERS.register("in-g-vit", "genshift.builders.in_g")
BUILDERS.freeze()
