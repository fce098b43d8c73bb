"""What the compat tests share: the fixtures' names, a fixture copied out of the repo, and ckptbench's restore of a
directory encoded as expected.json is (the one adapter to ckptbench's internals)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from compat_encoding import encode, flatten

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


def _leaves(key: str, v):
    """A restored value as expected.json keys it: plain data (a list of ids) whole, a structure holding tensors or
    arrays (a DCP byte entry: Megatron's RNG states) leaf by leaf under its flat keys."""
    if encode(v).get("object") is None:
        return [(key, encode(v))]
    return [(k, encode(x)) for k, x in flatten(v, key)]


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
    return listing, encoded(restore.load_state(listing.source, listing.format, shards=shards))


def restored_by_run(root: str, monkeypatch) -> dict:
    """The encoded state `run`'s own repeat loads (the fused read's buffers; a DCP checkpoint's chunks read by
    range), taken where the repeat hands it to its check."""
    from ckptbench.restore import runner
    from ckptbench.restore.repeat import RunOptions

    seen = []
    check = runner._check
    monkeypatch.setattr(runner, "_check", lambda restored, state, *a, **k: seen.append(state) or check(
        restored, state, *a, **k))
    reps = runner.run(root, RunOptions(), repeats=1)
    assert [r.status for r in reps] in (["ok"], ["unverified"]), reps[0].problems
    return encoded(seen[0])


def encoded(state) -> dict:
    """A CheckpointState as expected.json holds its groups."""
    return {"model": {k: encode(v) for k, v in state.model.items()},
           "extra": {k: e for key, v in state.extra.items() for k, e in _leaves(key, v)},
           "optim": {f"{n}.{k}": encode(t) for n, parts in state.optim.items() for k, t in parts.items()}}
