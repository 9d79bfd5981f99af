"""Builds whose bytes do not depend on where or with how many CPU threads they ran.

Two things made a rebuild differ from the first build: local paths recorded in the manifest, and
CPU kernels (matmul, convolution) whose reduction order depends on the number of intra-op
threads. Builders therefore record file names and sha256, never paths, and run every model step
under :func:`fixed_threads` with ``--cpu-threads`` (default 1) threads: the setting that decides
the bytes is fixed, recorded in the manifest (``determinism``) and part of the build fingerprint,
so resuming a build with another value is refused. GPU kernels are not covered: a GPU build is
byte-reproducible on the same GPU model and library versions, which the manifest records.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from genshift.cli._common import positive_int

DEFAULT_CPU_THREADS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpu-threads", type=positive_int, default=DEFAULT_CPU_THREADS,
                   help="torch intra-op CPU threads for every model step; fixed so that the output bytes do not "
                        "depend on the machine's thread count (recorded; a resume with another value is refused)")


@contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``; the previous count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def provenance(cpu_threads: int, device: str) -> dict:
    """What decides the bytes besides the models and seeds (goes into the manifest)."""
    import torch

    out = {"cpu_intra_op_threads": int(cpu_threads), "device": str(device), "torch": torch.__version__}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
        out["cuda"] = torch.version.cuda
    return out


def files_digest(root, files) -> dict:
    """``{"name": folder name, "files": n, "sha256": ...}`` of the files used from a local folder:
    sha256 over ``relative/path:sha256(content)`` lines in path order, so the record names what
    was read without the machine's path."""
    import hashlib
    from pathlib import Path

    from genshift.fsutil import sha256_file

    root = Path(root)
    lines = sorted(f"{Path(f).relative_to(root).as_posix()}:{sha256_file(f)}\n" for f in files)
    return {"name": root.name, "files": len(lines), "sha256": hashlib.sha256("".join(lines).encode()).hexdigest()}
