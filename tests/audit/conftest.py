"""Each audit test writes its anchors to a file of its own (the default, under var/, would carry one test's
anchors into the next test's verification)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def anchor_file(settings: Any, tmp_path: Path) -> Path:
    """The anchor file of this test (``settings.AUDIT_ANCHOR_PATH``), not yet written."""
    settings.AUDIT_ANCHOR_PATH = tmp_path / "audit_anchors.jsonl"
    settings.AUDIT_ANCHOR_S3_BUCKET = ""
    return settings.AUDIT_ANCHOR_PATH
