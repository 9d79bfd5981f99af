"""Dataset card templates, rendered when a suite is finalised or published.

A card is YAML front matter built from the manifest (one ``config`` per shift / edit family,
``dataset_info`` with one entry per config, as ``push_to_hub`` writes it) followed by a Markdown
body rendered from ``<template>.md.j2`` in this package.
"""

from __future__ import annotations

from importlib import resources

import jinja2
import yaml
from datasets import DatasetInfo, SplitDict, SplitInfo

IMAGENET_TERMS = (
    "Images that derive from ImageNet are subject to the ImageNet terms of access "
    "(https://image-net.org/download): non-commercial research and educational use only."
)


def front_matter(manifest, *, license: str = "other", pretty_name: str | None = None,
                 tags: list[str] | None = None, gated: bool = False) -> dict:
    """The card's YAML header for a suite manifest (``benchmark.suite_format.Manifest``)."""
    features = manifest.datasets_features()
    infos = []
    configs = []
    for name in sorted(manifest.configs):
        c = manifest.configs[name]
        configs.append({"config_name": name, "data_files": [{"split": "test", "path": f"data/{name}/*.parquet"}]})
        info = DatasetInfo(features=features, config_name=name)
        info.splits = SplitDict()
        info.splits.add(SplitInfo(name="test", num_examples=c.rows,
                                  num_bytes=sum(manifest.files[f].size for f in c.files)))
        infos.append(info._to_yaml_dict())
    head = {
        "license": license,
        "task_categories": ["image-classification"],
        "pretty_name": pretty_name or manifest.suite_id,
        "tags": ["genshift-bench", "distribution-shift", "imagenet", *(tags or [])],
        "configs": configs,
        "dataset_info": infos,
    }
    if gated:
        head["extra_gated_prompt"] = IMAGENET_TERMS
    return head


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("data_cards").joinpath(name).read_text(encoding="utf-8")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )


def render_card(manifest, *, template: str = "generic", context: dict | None = None,
                license: str = "other", pretty_name: str | None = None, tags: list[str] | None = None,
                gated: bool = False) -> str:
    """Render a complete README.md for a suite: YAML front matter + the template's body."""
    head = front_matter(manifest, license=license, pretty_name=pretty_name, tags=tags, gated=gated)
    body = _env().get_template(f"{template}.md.j2").render(
        manifest=manifest, configs=manifest.configs, generator=manifest.generator,
        imagenet_terms=IMAGENET_TERMS, **(context or {}))
    return "---\n" + yaml.safe_dump(head, sort_keys=False, allow_unicode=True) + "---\n\n" + body
