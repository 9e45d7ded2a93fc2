"""The runtime must import, and fail clearly, without boto3 (only the ``s3`` extra brings it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import sys
sys.modules["boto3"] = None  # as if the s3 extra were not installed
import trainer_runtime.objectstore as o
assert "kubernetes" not in sys.modules and "kopf" not in sys.modules
o.parse_s3_uri("s3://bucket/x")
try:
    o.S3Store()
except o.ObjectStoreConfigError as exc:
    assert "resumable-training[s3]" in str(exc), exc
    print("ok")
"""


def test_imports_without_boto3() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
