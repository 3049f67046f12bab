"""The one JSON shape every benchmark writes for ``make bench``'s summary (``bench/summary.py``).

``{"bench": name, "figures": {metric: value}, ...}``: metric names say their unit
(``set_ops_per_s``, ``p99_ms``); anything else a benchmark wants to keep (phases, parameters,
a peer's figures from the same run) goes beside ``figures`` under its own key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path | None, bench: str, figures: dict[str, float], **extra: Any) -> None:
    """Write the figures to ``path`` (nothing when None: the option was not given)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"bench": bench, "figures": figures, **extra}
    path.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
