"""What the compat tests share: the fixtures' names, a fixture copied out of the repo, and ckptbench's restore of a
directory encoded as expected.json is (the one adapter to ckptbench's internals)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from compat_encoding import encode

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
EXPECTED = "expected.json"


def fixture_names() -> list[str]:
    return sorted(n for n in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, n, EXPECTED)))


@dataclass
class Compat:
    name: str
    root: str  # the copy: what ckptbench is pointed at
    expected: dict

    @property
    def picked(self) -> str:
        """The directory the library's resume loads from, in the copy."""
        return os.path.normpath(os.path.join(self.root, self.expected["picked"]))


def copy_fixture(name: str, dest_parent) -> Compat:
    """The fixture copied under dest_parent, without its expected.json (not the library's: ckptbench would read it
    as one of the checkpoint's small files)."""
    src = os.path.join(FIXTURES, name)
    with open(os.path.join(src, EXPECTED)) as f:
        expected = json.load(f)
    root = os.path.join(str(dest_parent), name)
    shutil.copytree(src, root, ignore=shutil.ignore_patterns(EXPECTED))
    return Compat(name, root, expected)


def restored(root: str, load: bool = True):
    """(listing, encoded state) as ckptbench restores the directory: the listing picks the checkpoint and its
    files, load_state loads them (state None when not `load`). The one place that knows ckptbench's internals;
    update it when they change."""
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    listing = LocalSource(root, checkpoint=True).list()
    if not load:
        return listing, None
    shards = [f.path for f in listing.files if f.path.endswith(restore.SHARD_EXT.get(listing.format, ()))]
    state = restore.load_state(listing.source, listing.format, shards=shards)
    got = {"model": {k: encode(v) for k, v in state.model.items()},
           "extra": {k: encode(v) for k, v in state.extra.items()},
           "optim": {f"{n}.{k}": encode(t) for n, parts in state.optim.items() for k, t in parts.items()}}
    return listing, got
