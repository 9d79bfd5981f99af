"""Every option of an evaluation in one typed object that checks itself (``genshift.EvalOptions``).

Errors name the option (``topk must be in 5..1000, got 3``); the CLI maps an option to its flag.
The options that change the numbers are recorded in the result (``protocol``, ``run``) and hashed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass

from genshift.errors import BenchError

CHOICES = {
    "compile": ("auto", "on", "off"),
    "decode": ("cpu", "device"),
    "amp_dtype": ("bfloat16", "float16"),
    "checkpoint_weights": ("model", "ema"),
    "preprocess": ("timm", "lance-square", "lance-square-model-norm"),
}
BOUNDS = {"topk": (5, 1000), "bootstrap": (1, 100_000), "batch_size": (1, 65536), "workers": (0, 64),
          "limit_per_class": (1, 10_000_000), "seed": (0, 2**63 - 1), "max_resident": (1, 1024),
          "cpu_threads": (1, 1024), "forward_threads": (1, 256), "unit_rows": (1, 10_000_000)}
MAX_NOTES = 10_000
DEVICE = re.compile(r"cpu|cuda(:\d{1,3})?")


class OptionError(BenchError):
    """A bad option value; ``option`` is its name (the CLI maps it to its flag)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate. Defaults are those of ``bench eval``."""

    # weights and preprocessing
    revision: str | None = None        # the suite's commit sha (overrides the registry's pin)
    mask: str | None = None            # upstream ImageNet*: a mask file, or genshift.upstream.NO_MASK
    remap_by_order: bool = False       # checkpoint tensors mapped onto the model by position
    checkpoint_weights: str = "model"  # which weights of a timm training checkpoint: model or ema
    preprocess: str = "timm"           # timm | lance-square | lance-square-model-norm
    pretrained: bool = True            # False: random weights (tests, benchmarks)
    # what is scored (recorded in the result's protocol, hashed)
    topk: int = 10
    limit_per_class: int | None = None
    skip_bad_images: bool = False
    filter: bool = True                # score keep == True rows only
    reference_accuracy: float | None = None  # ImageNet*: impact against this ID accuracy instead of base
    bootstrap: int = 1000              # bootstrap replicates of the intervals
    seed: int = 0                      # bootstrap seed
    # how it runs (recorded in the result's run)
    device: str = "cpu"
    batch_size: int | None = None      # None: 8 on CPU (small batches are fastest there), 256 on CUDA
    workers: int | None = None         # DataLoader decode workers; None: min(4, cpus - 1)
    amp: bool = False                  # autocast (CUDA, or bf16 on CPU: the GPU numerics path, testable anywhere)
    amp_dtype: str = "bfloat16"
    channels_last: bool = True
    compile: str = "auto"              # auto: on CUDA when the run has COMPILE_MIN_IMAGES images or more
    decode: str = "cpu"                # cpu: PIL in the workers; device: torchvision.io.decode_jpeg batches
    normalize_on_device: bool | None = None  # None: on for CUDA (workers ship uint8, as timm's prefetcher)
    cudnn_benchmark: bool = True       # CUDA only, for the call
    cpu_threads: int = 1               # torch intra-op threads: CPU kernels' reduction order, so the bytes
    forward_threads: int | None = None  # CPU batches in flight, each at cpu_threads (None: the cores' share)
    unit_rows: int = 200               # checkpoint granularity: units are whole batches of >= this many rows
    max_resident: int = 4              # models loaded at once in a sweep
    force: bool = False                # re-run even if a finished result exists
    notes: str = ""                    # free text stored in the result
    progress: bool = True              # a progress bar on stderr

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type.startswith("bool") and not (isinstance(v, bool) or (v is None and "None" in f.type)):
                raise OptionError(f.name, f"{f.name} must be True or False, got {v!r}")
        for name, (lo, hi) in BOUNDS.items():
            v = getattr(self, name)
            if v is None and name in ("batch_size", "workers", "limit_per_class", "forward_threads"):
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise OptionError(name, f"{name} must be a whole number in {lo}..{hi}, got {v!r}")
            if not lo <= v <= hi:
                hint = " (acc@5 needs at least 5)" if name == "topk" and v < lo else ""
                raise OptionError(name, f"{name} must be in {lo}..{hi}, got {v}{hint}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise OptionError(name, f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
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
        return max(1, min(16, process_cores() // self.cpu_threads))

    def scoring(self, reference_config: str | None = None):
        """The metric switches (``genshift.eval.scoring.ScoringOptions``) these options ask for."""
        from genshift.eval.scoring import ScoringOptions

        return ScoringOptions(filter=self.filter, reference_config=reference_config,
                              reference_accuracy=self.reference_accuracy, n_boot=self.bootstrap, seed=self.seed)


def process_cores() -> int:
    """The cores this process may use: its CPU affinity, shared by the processes of one node under
    ``torchrun``/``accelerate launch`` (``LOCAL_WORLD_SIZE``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))
