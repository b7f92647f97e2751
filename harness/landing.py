"""Reading a landing directory as the Spark job finds it, for tests and soak runs that check
what the uploader shipped."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cairn.formats.batch import decode_batch


def landed(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(manifests, rows of every data file that has a manifest) under a landing dir."""
    manifests, rows = [], []
    for path in sorted(root.glob("*/*.manifest.json")):
        manifest = json.loads(path.read_text())
        data = (root / manifest["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest["sha256"]
        assert len(data) == manifest["bytes"]
        batch = decode_batch(data, manifest)
        assert len(batch) == manifest["count"]
        manifests.append(manifest)
        rows += batch
    return manifests, rows
