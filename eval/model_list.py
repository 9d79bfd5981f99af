"""The models of a sweep: ``--model`` (repeatable, ``NAME=CHECKPOINT``, timm wildcards) and
``--models FILE``, resolved and checked before any data is touched."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from genshift.errors import BenchError, did_you_mean
from genshift.fsutil import MAX_LIST_BYTES, read_text_limited
from genshift.identity import timm_name
from genshift.suites import is_population, list_populations, population_models

WILDCARD_CHARS = "*?["
MAX_MODELS = 5000


@dataclass(frozen=True)
class ModelSpec:
    """One model of a sweep: a name (as ``--model`` takes it) and optional local weights, or a
    module already loaded (``genshift.evaluate(model=nn.Module)``)."""

    name: str
    checkpoint: str | None = None
    from_wildcard: str | None = None  # the pattern it was expanded from
    classifier: object = field(default=None, compare=False, repr=False)  # genshift.eval.models.LoadedClassifier
    # a population's recorded eval data config, over timm's (e.g. timm 0.6.12's; not part of the spec's hash)
    data_config: dict | None = field(default=None, compare=False)
    data_config_from: str | None = None  # where it comes from ("timm 0.6.12"), recorded in the protocol


def is_wildcard(name: str) -> bool:
    return any(c in name for c in WILDCARD_CHARS)


def expand_wildcard(pattern: str) -> list[str]:
    """timm's ``list_pretrained`` for a pattern, 1000-class ImageNet heads only."""
    import timm
    from timm.models import get_pretrained_cfg

    prefix = "timm/" if pattern.startswith("timm/") else ""
    body = pattern[len(prefix):]
    if "/" in body or "@" in body or body.startswith("hf-hub:"):
        raise BenchError(f"wildcard {pattern!r}: only timm registry names can be expanded (e.g. "
                         "'timm/convnext_*.fb_in1k'); list Hub repos one by one")
    names = timm.list_pretrained(body)
    if not names:
        raise BenchError(f"wildcard {pattern!r} matches no timm pretrained model; check the pattern with "
                         "python -c \"import timm; print(timm.list_pretrained('...'))\"")
    keep = [n for n in names if getattr(get_pretrained_cfg(n), "num_classes", None) == 1000]
    if not keep:
        raise BenchError(f"wildcard {pattern!r} matches {len(names)} model(s) (e.g. {names[0]!r}) but none has a "
                         "1000-class ImageNet head; bench scores ImageNet-1k classifiers only (try an *_in1k tag)")
    return sorted(prefix + n for n in keep)


def parse_models_file(path: str | os.PathLike) -> list[ModelSpec]:
    """``--models FILE``: one model per line, optionally followed by whitespace and a checkpoint path
    (relative paths are taken from the file's folder); ``#`` starts a comment."""
    p = Path(path)
    if not p.exists():
        raise BenchError(f"--models {str(p)!r}: no such file and no such population."
                         f"{did_you_mean(str(p), list_populations())} (populations: {', '.join(list_populations())})")
    text = read_text_limited(p, max_bytes=MAX_LIST_BYTES, what="--models file")  # /dev/zero: one line, at once
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise BenchError(f"--models file {p.name} line {n}: expected 'MODEL [CHECKPOINT]', got {line!r}")
        ck = None
        if len(parts) == 2:  # a relative checkpoint path is relative to the list file, not the working directory
            ck = parts[1] if os.path.isabs(parts[1]) else str(p.parent / parts[1])
        out.append(ModelSpec(parts[0], ck))
    return out


def resolve_models(models: list[str] | None, *, models_file: str | None = None, checkpoint: str | None = None,
                   population_config: str = "paper") -> tuple[list[ModelSpec], dict[str, list[str]]]:
    """The sweep's model list from ``--model`` (repeatable; ``NAME=CHECKPOINT``; timm wildcards) and
    ``--models FILE`` (or a population: its members at their recorded data config, or at today's
    timm config with ``population_config="today"``). Every name is checked (timm's close matches
    for unknown ones) before any data is touched. Returns the specs and the wildcard expansions."""
    from genshift.eval.models import parse_model_name

    raw: list[ModelSpec] = []
    for m in models or []:
        name, sep, ck = m.partition("=")
        if sep and not ck:
            raise BenchError(f"--model {m!r}: NAME=CHECKPOINT needs a checkpoint path after '='")
        raw.append(ModelSpec(name.strip(), ck or None))
    if models_file:
        if is_population(models_file) and not os.path.exists(models_file):  # a named population, unless a file
            listed = [ModelSpec(n, None, data_config=dc, data_config_from=src)
                      for n, dc, src in population_models(models_file, config=population_config)]
        else:
            listed = parse_models_file(models_file)
        if not listed:
            raise BenchError(f"--models file {models_file!r} lists no model (only blank or # comment lines)")
        raw += listed
    if not raw:
        raise BenchError("no model given; pass --model NAME (repeatable) or --models FILE")
    if checkpoint is not None:
        if len(raw) != 1 or is_wildcard(raw[0].name):
            raise BenchError("--checkpoint applies to one model; with several models give each its weights as "
                             "--model NAME=CHECKPOINT or on its line of --models FILE")
        if raw[0].checkpoint:
            raise BenchError(f"model {raw[0].name!r} has a checkpoint twice (NAME=PATH and --checkpoint); give one")
        raw = [replace(raw[0], checkpoint=checkpoint)]
    specs: list[ModelSpec] = []
    expansions: dict[str, list[str]] = {}
    for spec in raw:
        if is_wildcard(spec.name):
            if spec.checkpoint:
                raise BenchError(f"wildcard {spec.name!r} cannot take a checkpoint; list the models one by one")
            names = expand_wildcard(spec.name)
            expansions[spec.name] = names
            specs += [ModelSpec(n, None, spec.name) for n in names]
        else:
            specs.append(spec)
    if len(specs) > MAX_MODELS:
        raise BenchError(f"{len(specs)} models in one sweep (limit {MAX_MODELS}); split the list")
    seen: dict[str, str] = {}
    weights: dict[tuple, str] = {}
    for spec in specs:
        ref = parse_model_name(spec.name)  # unknown names fail here, with timm's close matches
        # the id load_classifier will give the model (its output folder), without loading it; a checkpoint's id
        # needs its tensors (genshift.identity): the name and the file stand in
        key = (f"{timm_name(spec.name)}={checkpoint_sha256(spec.checkpoint)[:16]}" if spec.checkpoint is not None
               else f"{ref.repo_id}@{ref.revision}" if ref.revision else (ref.repo_id or ref.text))
        if key in seen:
            raise BenchError(f"model {key!r} is listed twice (as {seen[key]!r} and {spec.name!r}); "
                             "each model is scored once per sweep, remove the duplicate (two checkpoints of one "
                             "architecture: give the bare architecture name, their ids are then the files' sha256)")
        seen[key] = spec.name
        if spec.checkpoint is not None:  # the same weights under two names are scored once
            same = (timm_name(spec.name).split(".", 1)[0], checkpoint_sha256(spec.checkpoint))
            if same in weights:
                raise BenchError(f"checkpoint {spec.checkpoint!r} of {spec.name!r} holds the same weights (sha256 "
                                 f"{same[1][:12]}…) as {weights[same]!r}; each model is scored once, remove one")
            weights[same] = spec.name
    return specs, expansions


def checkpoint_sha256(path: str) -> str:
    """The sha256 of a checkpoint file (memoised per file version)."""
    from genshift.eval.models import check_checkpoint_file, weights_sha256

    check_checkpoint_file(path)  # exists, a regular readable file, not empty, within the size limit: one line
    try:
        return weights_sha256(path)  # the one memo: loading the model later reuses this digest
    except OSError as e:
        raise BenchError(f"checkpoint {path!r} cannot be read ({e.strerror}); check the path") from None
