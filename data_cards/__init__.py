"""Dataset card templates, rendered when a suite is finalised (``docs/format.md`` section 5): a YAML header from the Hub
and ``datasets`` APIs, then a ``<template>.md.j2`` body. A leaf: it imports nothing of genshift."""

from __future__ import annotations

from importlib import resources

import jinja2
from datasets import DatasetInfo
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData

IMAGENET_TERMS = ("Images that derive from ImageNet are subject to the ImageNet terms of access "
                  "(https://image-net.org/download): non-commercial research and educational use only.")
# license: other needs a name and a link on the Hub; the suites' images derive from ImageNet.
IMAGENET_LICENSE = ("imagenet-terms-of-access", "https://image-net.org/download")
# The Hub's size_categories buckets (upper bounds, exclusive).
SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                   (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"))


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` bucket for a number of rows."""
    return next((name for bound, name in SIZE_CATEGORIES if rows < bound), "100M<n<1B")


def card_data(manifest, *, license: str = "other", license_name: str | None = None, license_link: str | None = None,
              pretty_name: str | None = None, tags: list[str] | None = None, gated: bool = False) -> DatasetCardData:
    """The card's header for a suite manifest; ``license="other"`` gets a name and link (default: ImageNet terms)."""
    if license == "other":
        license_name = license_name or IMAGENET_LICENSE[0]
        license_link = license_link or IMAGENET_LICENSE[1]
    data = DatasetCardData(license=license, license_name=license_name, license_link=license_link,
                           task_categories=["image-classification"], pretty_name=pretty_name or manifest.suite_id,
                           size_categories=[size_category(sum(c.rows for c in manifest.configs.values()))],
                           tags=["genshift-bench", "distribution-shift", "imagenet", *(tags or [])])
    infos = DatasetInfosDict()  # no features: they travel in the parquet metadata
    for name, c in sorted(manifest.configs.items()):
        split = {"name": "test", "num_examples": c.rows, "num_bytes": sum(manifest.files[f].size for f in c.files)}
        infos[name] = DatasetInfo(config_name=name, splits={"test": split})
    MetadataConfigs({name: {"data_files": [{"split": "test", "path": f"data/{name}/*.parquet"}]}
                     for name in sorted(manifest.configs)}).to_dataset_card_data(data)
    infos.to_dataset_card_data(data)
    if gated:
        data["extra_gated_prompt"] = IMAGENET_TERMS
    return data


def demo_card(manifest) -> str:
    """The card of a synthetic demo suite (``bench demo-suite``, ``genshift.synthetic``)."""
    note = "Synthetic noise images for tests and demos: every model is expected to score about 0% on them."
    return render_card(manifest, template="generic", license="cc0-1.0", tags=["synthetic"],
                       pretty_name=f"{manifest.suite_id} (synthetic test suite)", context={"note": note})


def import_card(manifest) -> str:
    """The card of a suite made by ``bench import-folder`` (``genshift.importer``), from its manifest."""
    gen, ref = manifest.generator, manifest.generator.get("reference_config")
    note = f"Imported with `bench import-folder` ({gen.get('images')} images)"
    if ref is not None:
        shifts = ", ".join(c for c in sorted(manifest.configs) if c != ref)
        note += f": reference `{ref}`, shifts {shifts}; scored as ImageNet* (per-shift accuracy, absolute impact)"
    return render_card(manifest, template="generic", pretty_name=manifest.suite_id, context={"note": note + "."})


def upstream_card(manifest) -> str:
    """The card of the upstream ImageNet* release converted by ``genshift.upstream.convert_release``."""
    note = "Converted from madrylab/imagenet-star without re-encoding; keep = the authors' mask."
    return render_card(manifest, template="generic", license="mit", context={"note": note},
                       pretty_name="ImageNet* (upstream release, converted)")


def render_card(manifest, *, template: str = "generic", context: dict | None = None, **header) -> str:
    """A suite's README.md: :func:`card_data`'s YAML front matter (of ``header``) + the template's body."""
    text = resources.files("genshift.data_cards").joinpath(f"{template}.md.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    body = env.from_string(text).render(manifest=manifest, configs=manifest.configs, generator=manifest.generator,
                                        imagenet_terms=IMAGENET_TERMS, **(context or {}))
    return "---\n" + card_data(manifest, **header).to_yaml() + "\n---\n\n" + body
