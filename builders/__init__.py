"""Builders: regenerate each benchmark family in the suite format (``docs/builders.md``). Registered by suite id
(imported only when it runs), a builder module provides ``Config`` (a frozen
:class:`genshift.builders.common.BuildConfig`) and ``run(cfg) -> int``; ``bench build`` derives its flags from it.
"""

from __future__ import annotations

from genshift.registry import Registry

BUILDERS: Registry[str] = Registry("builder")  # suite id -> module path
BUILDERS.register("imagenet-star", "genshift.builders.imagenet_star")
BUILDERS.register("lance-hardimagenet", "genshift.builders.lance")
BUILDERS.register("in-g-rn", "genshift.builders.in_g")
BUILDERS.register("in-g-vit", "genshift.builders.in_g")
BUILDERS.freeze()
