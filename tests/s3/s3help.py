"""Helpers shared by the S3 tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os


def files_under(root) -> dict[str, bytes]:
    """Every file under root, by "/"-separated relative path."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root).replace(os.sep, "/")] = f.read()
    return out


def put_dir(client, bucket: str, prefix: str, root: str) -> None:
    """Upload with plain boto3 (not ckptbench), single PUTs."""
    for rel, data in files_under(root).items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)
