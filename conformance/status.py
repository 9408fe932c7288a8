"""The status file: how a supervised `kvparity` child tells its parent what it did (`conformance.supervisor`).

One JSON object per line, appended and fsynced as it happens: where the run folder is, the verdict, the
exit code. A child that ends without writing its exit code died during the work. Unsupervised (no
`KVPARITY_STATUS_FILE` in the environment) telling is a no-op.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATUS_ENV = "KVPARITY_STATUS_FILE"


def tell(**fields: Any) -> None:
    """Child side: append one status line (no-op when not supervised)."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(fields) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_status(path: str | Path) -> dict[str, Any]:
    """Every field the child told, later lines overriding earlier ones; a torn line is ignored."""
    out: dict[str, Any] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.update(json.loads(line))
        except (ValueError, TypeError):
            continue
    return out
