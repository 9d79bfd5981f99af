"""The leaderboard: results store, cross-model aggregation, and the Streamlit page told its :class:`Settings`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

# viewer mode: no developer menu, no Deploy button, no grid CSV export (the app offers formula-safe downloads of its
# own); `bench leaderboard` passes these as flags, an exported Space ships them in .streamlit/config.toml
STREAMLIT = {"client": {"toolbarMode": "viewer", "disableDataExport": True, "showErrorDetails": "none"},
             "server": {"headless": True, "runOnSave": False}, "browser": {"gatherUsageStats": False}}


@dataclass(frozen=True)
class Settings:
    """Everything the page is told: ``bench leaderboard``'s options, or an exported Space's ``space.json``."""

    results: str = "runs"             # a folder of runs, or ORG/NAME@sha of a Hub dataset repo
    trusted_keys: str | None = None   # the maintainers' public keys: only records they signed are verified
    suites: str | None = None         # trusted suite manifests: entries on other suite data are rejected
    id_accuracy: str | None = None    # ImageNet-val top-1 per model (the ID/OOD x-axis)
    hub_results: bool = False         # also show what model repos report on the Hub
    title: str = "genshift-bench leaderboard"

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str, base: Path | None = None) -> Settings:
        """From :meth:`dumps`'s JSON; paths that exist under ``base`` (an exported Space's folder) are taken there."""
        d = json.loads(text)
        for k in ("results", "trusted_keys", "suites", "id_accuracy"):
            if base is not None and d.get(k) and (base / d[k]).exists():
                d[k] = str(base / d[k])
        return cls(**d)
