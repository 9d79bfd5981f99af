"""genshift-bench core: suite registry, the suite format, Hub I/O, the ImageNet label space, the CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("genshift-bench")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
