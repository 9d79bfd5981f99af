"""What to evaluate and how. Every option of an evaluation is one typed object that checks itself
(``genshift.EvalOptions``): errors name the option (``topk must be in 5..1000, got 3``), the CLI maps it to its
flag; the options that change the numbers are recorded in the result (``protocol``, ``run``) and hashed. The
models of a sweep (``--model``, repeatable, ``NAME=CHECKPOINT``, timm wildcards, and ``--models FILE``) are
resolved and checked before any data is touched (:func:`resolve_models`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from genshift.errors import BenchError, did_you_mean
from genshift.fsutil import MAX_LIST_BYTES, read_text_limited
from genshift.identity import timm_name
from genshift.suites import is_population, list_populations, population_models

MAX_NOTES = 10_000
DEVICE = re.compile(r"cpu|cuda(:\d{1,3})?")


class OptionError(BenchError):
    """A bad option value; ``option`` is its name (the CLI maps it to its flag)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def _flag(default, help: str, **meta):
    """A field ``bench eval`` offers as a flag (``genshift.cli.build.add_config``): its help text, and
    ``choices``, ``bounds`` (checked here too) or ``flag`` where the name and type do not say them."""
    return dataclasses.field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate. Defaults are those of ``bench eval``."""

    # weights and preprocessing
    revision: str | None = _flag(None, "suite commit sha (overrides the registry's pin)")
    mask: str | None = None            # upstream ImageNet*: a mask file or upstream.NO_MASK (--mask, --no-mask)
    remap_by_order: bool = _flag(False, "map checkpoint tensors onto the model by position when key names differ")
    checkpoint_weights: str = _flag("model", "which weights of a timm training checkpoint: model (default, as timm's "
                                    "validate.py) or ema", choices=("model", "ema"))
    preprocess: str = _flag(
        "timm", "timm: the model's own eval transform (resize + centre crop); lance-square: LANCE's evaluation "
        "setting, the whole image squashed to 224x224, no crop, ImageNet mean/std for every model (as the authors "
        "ran it); lance-square-model-norm: the same squash with the model's own mean/std (recorded in the result)",
        choices=("timm", "lance-square", "lance-square-model-norm"))
    pretrained: bool = True            # False: random weights (tests, benchmarks)
    # what is scored (recorded in the result's protocol, hashed)
    topk: int = _flag(10, "predictions stored per image (5..1000)", bounds=(5, 1000))
    limit_per_class: int | None = _flag(None, "score only the first N images of each class (1..10000000)",
                                        bounds=(1, 10_000_000))
    skip_bad_images: bool = _flag(False, "skip and count images that do not decode")
    filter: bool = _flag(True, "score filtered (keep=false) rows too", flag="--no-filter")
    reference_accuracy: float | None = _flag(None, "ImageNet*: absolute impact against this in-distribution accuracy "
                                             "(0..1) instead of base")
    bootstrap: int = _flag(1000, "bootstrap replicates for the intervals (1..100000)", bounds=(1, 100_000))
    seed: int = _flag(0, "bootstrap seed (0..2**63-1)", bounds=(0, 2**63 - 1))
    # how it runs (recorded in the result's run)
    device: str = _flag("cpu", "cpu, cuda or cuda:N (under accelerate launch: each process's GPU)")
    batch_size: int | None = _flag(None, "default: 8 on CPU (fastest there), 256 on CUDA (1..65536)", bounds=(1, 65536))
    workers: int | None = _flag(None, "DataLoader decode workers (default: min(4, cpus-1); 0..64)", bounds=(0, 64))
    amp: bool = _flag(False, "autocast (bf16 by default) on CUDA, or on CPU to check the GPU numerics path there")
    amp_dtype: str = _flag("bfloat16", "autocast dtype with --amp", choices=("bfloat16", "float16"))
    channels_last: bool = _flag(True, "keep the default NCHW memory format", flag="--no-channels-last")
    compile: str = _flag("auto", "torch.compile the model (auto: on a GPU, for runs of 4000 images or more)",
                         choices=("auto", "on", "off"))
    decode: str = _flag("cpu", "cpu: PIL decode in the workers (default); device: JPEG batches decoded with "
                        "torchvision.io.decode_jpeg on --device (pixels differ slightly; recorded in the protocol)",
                        choices=("cpu", "device"))
    normalize_on_device: bool | None = None  # None: on for CUDA (workers ship uint8, as timm's prefetcher)
    cudnn_benchmark: bool = True       # CUDA only, for the call
    cpu_threads: int = _flag(1, "torch intra-op threads per process (default 1: the bytes of CPU predictions depend on "
                             "the thread count, so one value makes 1 and N processes write the same bytes; recorded; a "
                             "resume with another value is refused) (1..1024)", bounds=(1, 1024))
    forward_threads: int | None = _flag(None, "CPU: batches computed at once, each on its own thread at --cpu-threads "
                                        "(default: this process's share of the cores / --cpu-threads; the bytes do not "
                                        "depend on it; recorded) (1..256)", bounds=(1, 256))
    # checkpoint granularity: units are whole batches of >= this many rows
    unit_rows: int = dataclasses.field(default=200, metadata={"bounds": (1, 10_000_000)})
    max_resident: int = _flag(4, "sweep: models loaded at once; a larger preprocessing group is run in chunks "
                              "(1..1024)", bounds=(1, 1024))
    force: bool = _flag(False, "re-run even if a finished result exists")
    notes: str = _flag("", "free text stored in the result (up to 10000 characters)")
    progress: bool = _flag(True, "no progress bar", flag="--no-progress")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            name, v, meta = f.name, getattr(self, f.name), f.metadata
            if v is None and "None" in f.type:
                continue
            if f.type.startswith("bool") and not isinstance(v, bool):
                raise OptionError(name, f"{name} must be True or False, got {v!r}")
            if "bounds" in meta:
                lo, hi = meta["bounds"]
                if not isinstance(v, int) or isinstance(v, bool):
                    raise OptionError(name, f"{name} must be a whole number in {lo}..{hi}, got {v!r}")
                if not lo <= v <= hi:
                    hint = " (acc@5 needs at least 5)" if name == "topk" and v < lo else ""
                    raise OptionError(name, f"{name} must be in {lo}..{hi}, got {v}{hint}")
            if "choices" in meta and v not in meta["choices"]:
                raise OptionError(name, f"{name} must be one of {', '.join(meta['choices'])}, got {v!r}")
        if not isinstance(self.device, str) or not DEVICE.fullmatch(self.device):
            raise OptionError("device", f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        ref = self.reference_accuracy
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, (int, float)) or not 0 <= ref <= 1):
            raise OptionError("reference_accuracy", f"reference_accuracy is a fraction in [0, 1], got {ref!r}")
        if not isinstance(self.notes, str) or len(self.notes) > MAX_NOTES:
            raise OptionError("notes", f"notes must be text of at most {MAX_NOTES} characters")

    @classmethod
    def build(cls, options: EvalOptions | None = None, **overrides) -> EvalOptions:
        """``options`` (default: the defaults) with ``overrides``; an unknown name is one line with the close match."""
        names = [f.name for f in dataclasses.fields(cls)]
        for name in overrides:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                raise OptionError(name, f"unknown option {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
        return dataclasses.replace(options or cls(), **overrides)

    def device_normalizes(self) -> bool:
        if self.decode == "device":  # decoded on the device as uint8: it normalises too
            return True
        return self.device.startswith("cuda") if self.normalize_on_device is None else self.normalize_on_device

    def resolved_batch_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return 256 if self.device.startswith("cuda") else 8

    def resolved_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return max(1, min(4, (os.cpu_count() or 2) - 1))

    def resolved_forward_threads(self, *, compiled: bool = False) -> int:
        """Batches of one model computed at once on CPU threads, each at ``cpu_threads`` intra-op
        threads: a batch's kernels, so its bytes, are those of a one-thread run (a GPU runs one
        stream). A compiled model runs one batch at a time."""
        if not self.device.startswith("cpu") or compiled:
            return 1
        if self.forward_threads is not None:
            return self.forward_threads
        # the cores this process may use: its CPU affinity, shared by the processes of one node under
        # torchrun/accelerate launch (LOCAL_WORLD_SIZE)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        cores = max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))
        return max(1, min(16, cores // self.cpu_threads))

    def scoring(self, reference_config: str | None = None):
        """The metric switches (``genshift.eval.scoring.ScoringOptions``) these options ask for."""
        from genshift.eval.scoring import ScoringOptions

        return ScoringOptions(filter=self.filter, reference_config=reference_config,
                              reference_accuracy=self.reference_accuracy, n_boot=self.bootstrap, seed=self.seed)


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
