"""Builders: regenerate each benchmark family and write it in the suite format.

Each builder is a module registered here under its suite id (lazily: importing this package does
not import diffusers). A builder module provides::

    Config                  # its options: a frozen dataclass (genshift.builders.common.BuildConfig)
    run(cfg) -> int         # builds into cfg.out with genshift.writer.SuiteWriter

``bench build <suite>`` derives the flags from ``Config``; builders never import the CLI.

Shared generative components live next to the builders, one module each.
"""

from __future__ import annotations

from genshift.registry import Registry

# suite id -> module path (imported only when that builder runs)
BUILDERS: Registry[str] = Registry("builder")
BUILDERS.register("imagenet-star", "genshift.builders.imagenet_star")
BUILDERS.register("lance-hardimagenet", "genshift.builders.lance")
BUILDERS.register("in-g-rn", "genshift.builders.in_g")
BUILDERS.register("in-g-vit", "genshift.builders.in_g")
BUILDERS.freeze()

