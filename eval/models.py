"""Load any timm ImageNet-1k classifier with pinned weights and timm's own eval preprocessing. Names (a timm
registry name, a Hub repo, ``hf-hub:<repo>@<sha>``, any of them with ``checkpoint=FILE``): README, "`bench eval` in
more detail". The Hub revision is resolved to a commit sha, the model identified by ``genshift.identity``.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import pickle
import stat
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub as hf
import timm
import torch
from safetensors.torch import load_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform, resolve_data_config
from timm.models import clean_state_dict, get_pretrained_cfg

from genshift.errors import BenchError, NotFoundError, OfflineError, first_line, one_line
from genshift.eval.results import PROTOCOL_OPTIONS
from genshift.fsutil import StatKey, sha256_file
from genshift.hubio import OFFLINE_ROUTE, resolve_revision
from genshift.identity import canonical_id, tensors_sha256, timm_name

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors", "open_clip_pytorch_model.bin")
DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
# The largest timm ImageNet classifiers hold ~1B parameters (eva_giant: 4 GB in fp32; vit_gigantic 1.8B); a
# training checkpoint with EMA weights and Adam state is ~4x that. Anything larger is not a classifier.
MAX_CHECKPOINT_BYTES = 32 << 30
MAX_MODEL_PARAMS = 2 * 10**9


@dataclass(frozen=True)
class ModelRef:
    """A parsed model name: timm architecture name and/or Hub repo, requested revision."""

    text: str
    name: str | None        # timm registry name (arch or arch.tag); None for a bare hf-hub repo
    repo_id: str | None     # Hub repo holding the weights
    revision: str | None    # requested revision (branch, tag or sha) or None


@dataclass
class LoadedClassifier:
    """A model ready for inference plus everything a result records about it."""

    model: torch.nn.Module
    transform: object
    data_config: dict
    model_id: str                        # canonical id (genshift.identity): "timm/resnet50.a1_in1k", "arch@sha256:…"
    architecture: str
    source: str                          # one of genshift.identity.SOURCES
    num_params: int
    tag: str | None = None               # Hub weights' tag; None for local weights (their name is only declared_name)
    weights_revision: str | None = None  # 40-char Hub sha
    weights_sha256: str | None = None    # the weights file's bytes
    pretrained_cfg: dict = field(default_factory=dict)
    checkpoint_weights: str | None = None  # "model" | "ema" when --checkpoint was a training checkpoint
    tensors_sha256: str | None = None      # genshift.identity.tensors_sha256 of the loaded state dict
    declared_name: str | None = None       # the name local weights were given (a claim, never the id)

    @classmethod
    def from_module(cls, model: torch.nn.Module, *, model_id: str | None = None, data_config: dict | None = None,
                    transform=None, preprocess: str = "timm") -> LoadedClassifier:
        """A module holding its weights (``genshift.evaluate(model=...)``): a timm model brings its data
        config; any other module takes ``data_config`` (timm's keys, the rest defaulted as timm does) or
        ``transform``, and ``model_id``. Its id: the architecture (or ``model_id``) and its tensors' digest."""
        cfg = dict(getattr(model, "pretrained_cfg", None) or {})
        name = cfg.get("architecture") or model_id
        if name is None or (not cfg and data_config is None and transform is None):
            raise BenchError("a module that is not a timm model needs model_id= and data_config= (or transform=)")
        if transform is not None:  # recorded by what it does, as far as its repr says
            data_config = {"transform": repr(transform)}
        elif data_config is not None:
            data_config = _jsonable({k: v for k, v in resolve_data_config(dict(data_config)).items()
                                     if k in DATA_CONFIG_KEYS})
        else:
            data_config, transform = eval_transform(model, preprocess)
        check_label_space(model, name)
        digest = tensors_sha256(model.state_dict())
        return cls(model=model, transform=transform, data_config=data_config, source="module", architecture=name,
                   model_id=canonical_id(source="module", name=name, tensors_sha256=digest), declared_name=model_id,
                   num_params=sum(p.numel() for p in model.parameters()), tensors_sha256=digest,
                   pretrained_cfg=_jsonable(cfg))

    def describe(self) -> dict:
        # optional fields only when they apply
        extra = {k: v for k, v in (("checkpoint_weights", self.checkpoint_weights),
                                   ("declared_name", self.declared_name)) if v}
        return {**extra,
            "id": self.model_id, "architecture": self.architecture, "tag": self.tag, "source": self.source,
            "weights_revision": self.weights_revision, "weights_sha256": self.weights_sha256,
            "tensors_sha256": self.tensors_sha256, "num_params": self.num_params,
            "pretrained_cfg": {k: v for k, v in self.pretrained_cfg.items()  # local weights: no Hub repo to link
                               if k in ("architecture", "tag", "license", "num_classes", "input_size",
                                        "test_input_size", "crop_pct", "test_crop_pct")
                               or k == "hf_hub_id" and self.source == "hf-hub"},
        }


def parse_model_name(text: str) -> ModelRef:
    """Split a user-given model name into registry name, Hub repo and revision."""
    raw = text.strip()
    if not raw:
        raise BenchError("empty --model; give a timm name such as 'resnet50.a1_in1k' or 'timm/resnet50.a1_in1k'")
    body, _, rev = raw.partition("@")
    rev = rev or None
    body = body.removeprefix("hf-hub:")
    if "/" in body:
        if body.count("/") != 1:
            raise BenchError(f"model {raw!r} is not a timm name or an org/name Hub repo id")
        return ModelRef(raw, body.split("/", 1)[1] if body.startswith("timm/") else None, body, rev)
    # registry name: resolve the default tag and the weights' Hub repo
    arch = body.split(".", 1)[0]
    if not timm.is_model(arch):
        raise NotFoundError(f"unknown timm model {body!r}.{_suggest(body)}")
    cfg = _pretrained_cfg(body)
    if cfg is None:
        raise NotFoundError(f"timm has no pretrained weights named {body!r}.{_suggest(body)}")
    full = f"{cfg.architecture}.{cfg.tag}" if cfg.tag else cfg.architecture
    repo = (cfg.hf_hub_id or "").split("@")[0] or None
    return ModelRef(raw, full, repo, rev)


def _pretrained_cfg(name: str):
    try:
        return get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:  # noqa: BLE001 - timm raises several types for unknown tags
        return None


def _suggest(name: str) -> str:
    arch = name.split(".", 1)[0]
    pool = timm.list_pretrained(f"{arch}*") or timm.list_pretrained()
    close = difflib.get_close_matches(name, pool, n=4, cutoff=0.4)
    if not close:
        return " See timm.list_pretrained() for the names."
    return " Did you mean " + ", ".join(repr(c) for c in close) + "?"


def resolve_model_revision(repo_id: str, revision: str | None) -> str:
    """The 40-character commit sha of ``repo_id`` at ``revision`` (default ``main``)."""
    return resolve_revision(repo_id, revision, repo_type="model",
                            pin_hint=f"(hf-hub:{repo_id}@<sha>), or pass a local file with --checkpoint")


def load_classifier(name: str, *, checkpoint: str | os.PathLike | None = None, device: str = "cpu",
                    remap_by_order: bool = False, pretrained: bool = True,
                    checkpoint_weights: str = "model", preprocess: str = "timm",
                    data_config: dict | None = None) -> LoadedClassifier:
    """Create the model, load pinned weights, check the label space, resolve preprocessing.

    ``checkpoint``: local weights (:func:`read_checkpoint`); ``remap_by_order``: map its tensors onto the model's
    by position when key names differ (shapes must still match); ``pretrained=False``: random weights;
    ``checkpoint_weights``: ``"model"`` or ``"ema"`` of a training checkpoint; ``preprocess`` and ``data_config``
    (a population's record of the paper's timm, ``genshift.suites``): :func:`eval_transform`.
    """
    if checkpoint is not None:
        check_checkpoint_file(checkpoint)  # before any architecture is built (eva_giant: 3.7 GB of RAM)
    ref = parse_model_name(name)
    picked = rev = wsha = declared = None
    if checkpoint is not None or not pretrained:
        arch_name = ref.name or (ref.repo_id.split("/", 1)[1] if ref.repo_id else None)
        if arch_name is None or not timm.is_model(arch_name.split(".", 1)[0]):
            raise BenchError(f"--checkpoint needs a timm architecture name as --model, got {name!r}")
        state = read_checkpoint(checkpoint, weights=checkpoint_weights) if checkpoint is not None else None
        meta = _meta_params(lambda: timm.create_model(arch_name, pretrained=False), arch_name)
        if state is not None:
            _fits(meta.num_params, sum(t.numel() for t in state[0].values()), arch_name, "values")
        model = timm.create_model(arch_name, pretrained=False)
        source, declared = ("checkpoint" if checkpoint is not None else "random"), timm_name(name)
        if checkpoint is not None:
            entry = load_checkpoint(model, checkpoint, remap_by_order=remap_by_order, state=state)
            picked = checkpoint_weights if entry is not None else None
            wsha = weights_sha256(checkpoint)
    else:
        if ref.repo_id is None:
            raise BenchError(f"timm has no Hub weights for {name!r}; pass --checkpoint FILE")
        rev = resolve_model_revision(ref.repo_id, ref.revision)
        model, wfile = _create_pinned(ref, rev)
        arch_name = ref.name or model.pretrained_cfg.get("architecture", ref.repo_id)
        source, wsha = "hf-hub", weights_sha256(wfile)
    digest = tensors_sha256(model.state_dict())  # what was loaded, whatever file or format it came from
    arch, _, tag = arch_name.partition(".")
    model_id = canonical_id(source=source, name=arch, repo_id=ref.repo_id, tensors_sha256=digest)
    check_label_space(model, model_id)
    model.eval().to(device)
    cfg = dict(model.pretrained_cfg or {})
    data_config, transform = eval_transform(model, preprocess, data_config)
    return LoadedClassifier(
        model=model, transform=transform, data_config=data_config, model_id=model_id, architecture=arch,
        tag=(tag or cfg.get("tag")) if source == "hf-hub" else None, source=source, weights_revision=rev,
        weights_sha256=wsha, num_params=sum(p.numel() for p in model.parameters()),
        pretrained_cfg=_jsonable(cfg), checkpoint_weights=picked, tensors_sha256=digest, declared_name=declared,
    )


def _meta_params(build, what: str):
    """Build ``build()`` on the meta device (no memory) and count its parameters (``num_params``): refused
    over ``MAX_MODEL_PARAMS`` before anything real is allocated. Returns the meta model."""
    try:
        with torch.device("meta"):
            model = build()
    except (RuntimeError, NotImplementedError) as e:
        raise BenchError(f"{what} cannot be sized before it is built ({type(e).__name__}: {one_line(e, 160)})") \
            from None
    model.num_params = n = sum(p.numel() for p in model.parameters())
    if n > MAX_MODEL_PARAMS:
        raise BenchError(f"{what} has {n:,} parameters, over the limit of {MAX_MODEL_PARAMS:,} for an ImageNet "
                         "classifier; check its name or its repo's config.json")
    return model


def _fits(n: int, have: int, what: str, unit: str) -> None:
    """Weights of ``have`` bytes (at least one a parameter) or tensor values cannot hold fewer than ``n`` parameters:
    an architecture (a name, a repo's config.json) that is not its weights' is refused before it is built."""
    if have < n:
        raise BenchError(f"the {'checkpoint' if unit == 'values' else 'weights file'} does not fit {what}: it has "
                         f"{n:,} parameters, the weights hold {have:,} {unit} (check the model name or config.json)")


def _create_pinned(ref: ModelRef, sha: str):
    """The Hub model at ``sha`` and its weights file, sized on the meta device before anything is allocated."""
    if ref.name is not None and _pretrained_cfg(ref.name) is not None:
        # registry cfg (incl. test size) with the weights pinned at the resolved sha
        args, kw = (ref.name,), {"pretrained_cfg_overlay": {"hf_hub_id": f"{ref.repo_id}@{sha}"}}
    else:
        args, kw = (f"hf-hub:{ref.repo_id}@{sha}",), {}
    try:
        meta = _meta_params(lambda: timm.create_model(*args, pretrained=False, **kw), f"{ref.repo_id}@{sha[:12]}")
        wfile = _hub_weights(ref.repo_id, sha, meta.pretrained_cfg.get("hf_hub_filename"))
        _fits(meta.num_params, os.path.getsize(wfile), f"{ref.repo_id}@{sha[:12]}", "bytes")
        return timm.create_model(*args, pretrained=True, **kw), wfile
    except hf.errors.LocalEntryNotFoundError:
        raise OfflineError(f"weights of {ref.repo_id}@{sha[:12]} are not in the local cache and the Hub is not "
                           f"reachable; run once with network or pass --checkpoint FILE{OFFLINE_ROUTE}") from None
    except hf.errors.EntryNotFoundError as e:
        raise NotFoundError(f"{ref.repo_id}@{sha[:12]} has no timm weights/config ({e}); is it a timm model "
                            "repo?") from None


def _hub_weights(repo_id: str, sha: str, preferred: str | None) -> str:
    """The weights file of a Hub model at ``sha`` (downloaded to the cache, as timm then reads it)."""
    for fn in dict.fromkeys(((preferred,) if preferred else ()) + WEIGHT_FILES):
        try:
            return hf.hf_hub_download(repo_id, fn, revision=sha)
        except hf.errors.LocalEntryNotFoundError:
            raise
        except hf.errors.EntryNotFoundError:
            continue
    raise hf.errors.EntryNotFoundError(f"none of {', '.join(WEIGHT_FILES)}")


def eval_transform(model, preprocess: str = "timm", recorded: dict | None = None) -> tuple[dict, object]:
    """The eval data config and the transform built from it (``timm.data.create_transform``): ``"timm"``, timm's
    own at test size; ``"lance-square"``, LANCE's released evaluation (Prabhu et al. 2023): squashed to 224 x 224,
    bilinear, no crop, ImageNet mean/std for every model, as timm's ``crop_mode="squash"``, ``crop_pct=1.0`` so the
    recorded data config says it; ``"lance-square-model-norm"``, the same with the model's own mean/std
    (``docs/results.md``, ``data_config``). ``recorded`` (a population's data config) replaces timm's keys first.
    """
    cfg = resolve_data_config({}, model=model, use_test_size=True)
    if recorded:
        cfg.update({k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()})
    if preprocess in ("lance-square", "lance-square-model-norm"):
        cfg = {**cfg, "input_size": (3, 224, 224), "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash"}
        if preprocess == "lance-square":
            cfg.update(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    elif preprocess != "timm":
        # one list: eval_transform builds them, the result schema checks them
        raise BenchError(f"unknown preprocessing {preprocess!r}; choose one of "
                         f"{', '.join(PROTOCOL_OPTIONS['preprocess'])}")
    transform = create_transform(**cfg, is_training=False)
    return _jsonable({k: cfg[k] for k in DATA_CONFIG_KEYS if k in cfg}), transform


def check_label_space(model, model_id: str) -> None:
    n = getattr(model, "num_classes", None)
    if n != 1000:
        raise BenchError(f"model {model_id} has {n} output classes, not the 1000 ImageNet-1k classes; bench scores "
                         "ImageNet-1k classifiers only (pick an *_in1k or *_ft_in1k tag)")


# Entries of a training checkpoint for each choice of weights, in the order timm's ``load_state_dict`` looks for them.
_ENTRIES = {"model": ("state_dict", "model", "model_state_dict"), "ema": ("state_dict_ema", "model_ema")}
CHECKPOINT_WEIGHTS = tuple(_ENTRIES)


def weights_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a weights file, read once per process while the file is unchanged (``StatKey``): a sweep
    checks the model list, loads and reloads (``max_resident``) a model with one read of a multi-GB file."""
    real = os.path.realpath(path)
    return _sha256_of(real, StatKey.of(real))


@functools.lru_cache(maxsize=4096)
def _sha256_of(path: str, key: StatKey) -> str:
    return sha256_file(path)


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """A local checkpoint is a readable, non-empty regular file of at most ``MAX_CHECKPOINT_BYTES``, else one line
    naming it. Cheap (a stat and a 1-byte read): called before the architecture is built."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        why = "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror})"
        raise BenchError(f"checkpoint {str(path)!r} {why}; check the path") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise BenchError(f"checkpoint {str(path)!r} is {kind}; give the weights file (.safetensors, .pth, .bin)")
    if st.st_size == 0:
        raise BenchError(f"checkpoint {str(path)!r} is empty (0 bytes); the download or copy did not finish")
    if st.st_size > MAX_CHECKPOINT_BYTES:
        raise BenchError(f"checkpoint {str(path)!r} is {st.st_size} bytes, over the {MAX_CHECKPOINT_BYTES >> 30} GiB "
                         "limit for a classifier's weights; is it the right file?")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise BenchError(f"checkpoint {str(path)!r} cannot be read ({e.strerror}); fix its permissions") from None
    return path


def read_checkpoint(path: str | os.PathLike, *, weights: str = "model") -> tuple[dict, str | None]:
    """A checkpoint file -> ``(state_dict, entry)``, ``entry`` the training-checkpoint key used: safetensors, a plain
    state dict or a timm ``train.py`` checkpoint, weights-only; ``weights`` ``"model"`` (timm ``validate.py``'s
    default) or ``"ema"`` (``--use-ema``); prefixes removed by timm's ``clean_state_dict``."""
    path = Path(path)
    if weights not in CHECKPOINT_WEIGHTS:
        raise BenchError(f"--checkpoint-weights must be one of {', '.join(CHECKPOINT_WEIGHTS)}, got {weights!r}")
    check_checkpoint_file(path)
    try:
        if path.suffix == ".safetensors":
            sd = load_file(str(path))
        else:  # timm's train.py stores its argparse.Namespace under ``args`` (its values are still checked)
            with torch.serialization.safe_globals([argparse.Namespace]):
                sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any decode failure is the user's file
        unsafe = []
        if isinstance(e, pickle.UnpicklingError):  # the globals, other than timm's Namespace, it refuses
            with suppress(Exception):  # not a pickle torch can scan: the file is damaged, said below
                unsafe = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
                          if g != "argparse.Namespace"]
        if unsafe:
            raise BenchError(f"checkpoint {str(path)!r} holds Python objects ({', '.join(unsafe[:3])}) that "
                             "weights-only loading refuses (bench never unpickles arbitrary code); save the weights "
                             "alone: torch.save(model.state_dict(), 'weights.pth') or safetensors") from None
        raise BenchError(f"cannot read checkpoint {str(path)!r} ({type(e).__name__}: {first_line(e)}); expected a "
                         "safetensors file, a PyTorch state dict or a timm training checkpoint") from None
    entries = sd if isinstance(sd, dict) else {}
    found = {w: next((k for k in keys if isinstance(entries.get(k), dict)), None) for w, keys in _ENTRIES.items()}
    entry = found[weights]
    if weights == "ema" and entry is None:
        raise BenchError(f"checkpoint {path.name} has no EMA weights (no state_dict_ema entry); drop "
                         "--checkpoint-weights ema to score its model weights")
    if entry is None and found["ema"] is not None:
        raise BenchError(f"checkpoint {path.name} holds only EMA weights ({found['ema']}); pass "
                         "--checkpoint-weights ema")
    if entry is not None:
        sd = sd[entry]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise BenchError(f"checkpoint {str(path)!r} is not a state dict of tensors (nor a training checkpoint with "
                         "a state_dict entry)")
    return clean_state_dict(sd), entry


def load_checkpoint(model: torch.nn.Module, path: str | os.PathLike, *, remap_by_order: bool = False,
                    weights: str = "model", state: tuple[dict, str | None] | None = None) -> str | None:
    """Load a local checkpoint strictly (``state``: :func:`read_checkpoint`'s answer for ``path``, read already);
    mismatches are one error. Returns the training-checkpoint entry loaded (``None``: a plain state dict)."""
    path = Path(path)
    sd, entry = state or read_checkpoint(path, weights=weights)
    own = model.state_dict()
    if remap_by_order and set(sd) != set(own):
        if len(sd) != len(own):
            raise BenchError(f"checkpoint {path.name} has {len(sd)} tensors, model has {len(own)}; cannot map by order")
        sd = dict(zip(own.keys(), sd.values()))
    mismatches = {"missing keys": [k for k in own if k not in sd], "unexpected keys": [k for k in sd if k not in own],
                  "shape mismatches": [f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own
                                       if k in sd and sd[k].shape != own[k].shape]}
    parts = [f"{len(keys)} {what} (e.g. {keys[0]})" for what, keys in mismatches.items() if keys]
    if parts:
        hint = " (keys differ but count matches: try --remap-by-order)" if (
            not remap_by_order and len(sd) == len(own) and not mismatches["shape mismatches"]) else ""
        raise BenchError(f"checkpoint {path.name} does not fit {type(model).__name__}: {'; '.join(parts)}{hint}")
    model.load_state_dict(sd, strict=True)
    return entry


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items() if not callable(v)}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
