"""The S3 benchmark's data set: seeded random objects written once, and the check that a tree read back holds them."""

from __future__ import annotations

import os
import random

from _harness import MiB, Shape

SEED = 20240611


def make_dataset(directory: str, shape: Shape) -> tuple[dict[str, tuple[int, str]], dict[str, str]]:
    """Seeded random bytes written under directory; returns rel -> (size, crc32c) and rel -> md5 of those bytes."""
    import hashlib

    import fastio

    rng = random.Random(SEED)
    out, md5s = {}, {}
    names = [(f"big/shard-{i:03d}.bin", shape.big_size) for i in range(shape.big_files)]
    names += [(f"small/tensor-{i:03d}.bin", shape.small_size) for i in range(shape.small_files)]
    for rel, size in names:
        data = rng.randbytes(size)
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        h = fastio.Hasher("crc32c")
        h.update(data)
        out[rel] = (size, h.hexdigest())
        md5s[rel] = hashlib.md5(data).hexdigest()  # the s3torchconnector child checks with hashlib alone
    return out, md5s


def crc_file(path: str) -> str:
    import fastio

    h = fastio.Hasher("crc32c")
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def check_tree(directory: str, expected: dict[str, tuple[int, str]]) -> str | None:
    """None when every expected file is there with the right size and crc32c; else what is wrong."""
    for rel, (size, crc) in expected.items():
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            return f"{rel}: missing"
        if os.path.getsize(path) != size:
            return f"{rel}: {os.path.getsize(path)} bytes, expected {size}"
        if crc_file(path) != crc:
            return f"{rel}: crc32c differs"
    return None
