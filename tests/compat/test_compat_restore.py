"""ckptbench against checkpoints the training libraries wrote themselves: it restores the checkpoint the library's own
resume picks, and every value that resume loads, bit for bit (expected.json, recorded from the library at generation
time; see README.md for each fixture's key mapping)."""

from __future__ import annotations

import json
import os

import pytest
from compat_encoding import same
from compat_helpers import fixture_names, restored, restored_by_run

NAMES = fixture_names()


def _under(path: str, directory: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(directory)]) == os.path.realpath(directory)


def _restores_picked(source: str, c) -> bool:
    """The source is the picked checkpoint, or (DeepSpeed) the save folder whose pointer file names it, as the
    library's own resume is pointed at it."""
    if os.path.realpath(source) == os.path.realpath(c.picked):
        return True
    if c.expected.get("picked_file"):  # Lightning resumes from the file (fit(ckpt_path=...)), as run names it
        return os.path.realpath(source) == os.path.realpath(os.path.join(c.root, c.expected["picked_file"]))
    return bool(c.expected.get("pointer")) and os.path.realpath(source) == os.path.realpath(c.root)


def _diff(got: dict, want: dict, what: str) -> str:
    """One readable line per kind of difference, a few keys each."""
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if not same(got[k], want[k]))
    lines = [f"{what}: {len(got)} restored, {len(want)} expected"]
    if missing:
        lines.append(f"  {len(missing)} the library loads but ckptbench does not: {missing[:5]}")
    if unexpected:
        lines.append(f"  {len(unexpected)} ckptbench restores that the library does not: {unexpected[:5]}")
    for k in differ[:5]:
        lines.append(f"  {k!r}: ckptbench {got[k]} != library {want[k]}")
    if len(differ) > 5:
        lines.append(f"  ... {len(differ)} values differ")
    return "\n".join(lines)


def _assert_group(got: dict, want: dict, what: str) -> None:
    ok = set(got) == set(want) and all(same(got[k], want[k]) for k in want)
    assert ok, _diff(got, want, what)


@pytest.mark.parametrize("name", NAMES)
def test_run_restores_the_checkpoint_the_library_resumes(name, compat, cli, tmp_path):
    c = compat(name)
    r = cli("run", c.root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "unverified", doc.get("error")
    assert _restores_picked(doc["source"], c), f"restored {doc['source']}, the library resumes {c.picked}"
    listing, _ = restored(c.root, load=False)
    pointer = os.path.join(c.root, c.expected.get("pointer") or "")
    outside = [os.path.relpath(f.path, c.root) for f in listing.files
               if not _under(f.path, c.picked) and f.path != pointer]
    assert not outside, f"reads files outside the picked checkpoint {c.expected['picked']!r}: {outside[:3]}"
    assert doc["files"] == len(listing.files) and doc["bytes"] == sum(f.size for f in listing.files)


@pytest.mark.parametrize("name", NAMES)
def test_restored_values_equal_what_the_library_loads(name, compat):
    c = compat(name)
    listing, got = restored(c.root)
    rels = {os.path.relpath(f.path, c.root).replace(os.sep, "/") for f in listing.files}
    unread = sorted(set(c.expected.get("torch_loaded", ())) - rels - set(c.expected.get("not_compared", {})))
    assert not unread, f"the library's resume loads {unread}, ckptbench does not read them"
    _assert_group(got["model"], c.expected["model"], "weights")
    _assert_group(got["extra"], c.expected["extra"], "other state")
    assert got["optim"] == {}, "a foreign checkpoint's optimizer state belongs in extra, by its own keys"


@pytest.mark.parametrize("name", NAMES)
def test_the_run_itself_restores_what_the_library_loads(name, compat, monkeypatch):
    """Through `run`'s repeat, not load_state alone: its DCP load goes by the chunks read by range, and a state file
    merged in one path and not the other (Megatron's common.pt) would restore a different state."""
    c = compat(name)
    got = restored_by_run(c.root, monkeypatch)
    _assert_group(got["model"], c.expected["model"], "weights")
    _assert_group(got["extra"], c.expected["extra"], "other state")


@pytest.mark.parametrize("name", NAMES)
def test_inspect_verify_load_accept_it(name, compat, cli):
    c = compat(name)
    r = cli("inspect", c.root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert _restores_picked(doc["source"], c), f"inspects {doc['source']}, the library resumes {c.picked}"
    if c.expected.get("pointer"):
        assert doc["layout"]["tag"] == os.path.basename(c.picked)
    r = cli("verify", c.root)  # the libraries write no manifest: 3, nothing to check against (README)
    assert r.rc == 3, r.err or r.out
    r = cli("load", c.root)
    assert r.rc == 0, r.err or r.out


def test_optimizer_step_asked_of_a_structural_check_says_it_did_not_run(compat, cli, tmp_path):
    root = compat("trainer_outdir").root  # no model shape ckptbench can build: the check is structural
    r = cli("load", root, "--optimizer-step")
    assert r.rc == 0, r.err
    assert "--optimizer-step not run" in r.out
    assert json.loads(cli("load", root, "--optimizer-step", "--json").out)["optimizer_step"] is None
    r = cli("run", root, "--optimizer-step", "--repeat", "1", "--json", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert "--optimizer-step not run" in json.loads(r.out)["notes"]["check"]
    assert "--optimizer-step" not in cli("load", root).out  # not asked: not mentioned
