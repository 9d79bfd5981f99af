"""genshift-bench: benchmarks and a leaderboard for ImageNet classifiers under generated distribution shifts.

>>> import genshift
>>> result = genshift.evaluate("timm/resnet50.a1_in1k", "imagenet-star", configs=["in_the_snow"])  # doctest: +SKIP

The names below are imported on first use, so ``import genshift`` (and ``bench --help``) stays light.
"""

import pkgutil
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("genshift-bench")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {"evaluate": "genshift.eval.runner:evaluate", "Result": "genshift.eval.runner:Result",
            "EvalOptions": "genshift.eval.options:EvalOptions", "verify": "genshift.eval.runner:verify",
            "slope": "genshift.eval.runner:slope", "load_suite": "genshift.hub:open_suite"}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'genshift' has no attribute {name!r}")
    globals()[name] = value = pkgutil.resolve_name(_EXPORTS[name])
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
