"""Crafted checkpoints against `pack`, `unpack` and the loader's member reads: every name, offset and size in a
manifest is hostile. Each attack ends in exit 1 with one line on stderr, no traceback, the source untouched, and
nothing written anywhere: no OUT, no temporary sibling, no copy of a file from outside the checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

# A name or number that is wrong on its face is refused by the manifest's schema (exit 2, manifest.parse) or, if
# it gets that far, by packs' own check (exit 1); either way before anything is opened. What only the files can
# tell (a symlink, a FIFO, a size, an overlap, a clash) is hostile content: exit 1.
SCHEMA = (1, 2)
CONTENT = (1,)
MARK = b"ROOT-ONLY-SECRET"
SECRET = MARK * 16384  # 256 KiB: larger than any member, so a crafted record can ask for any of it
MEMBER = "dataloader/rank001_worker0001.idx"  # pack-00001-of-00004's member (config.json stays a file)
PACK1_BYTES = 94275


@pytest.fixture(scope="module")
def packed(h, ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "packed"
    r = h.run_cli("pack", ckpt("torch", 4), out, "--target-files", "4")
    assert r.rc == 0, r.err
    return str(out)


@pytest.fixture
def secret(tmp_path):
    """A root-only file beside the checkpoint, as /etc/shadow would be."""
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return path


def _crafted(src, tmp_path) -> str:
    """A copy of `src` at tmp_path/in/crafted: one level down, so "../x" from it is still inside tmp_path."""
    (tmp_path / "in").mkdir()
    return shutil.copytree(src, tmp_path / "in" / "crafted", symlinks=True)


def _edit(h, root, change) -> None:
    man = h.read_manifest(root)
    change(man)
    h.write_manifest(root, man)


def _entry(man, path) -> dict:
    hit = [e for e in man["files"] if e["path"] == path]
    assert len(hit) == 1, path
    return hit[0]


def _repoint_pack(man, pack_file, new_name, size) -> None:
    """The pack's table and its file entry renamed to `new_name`, one member reading `size` bytes from it."""
    man["packs"].pop(pack_file)
    man["packs"][new_name] = {MEMBER: [0, size, "small", None]}
    e = _entry(man, pack_file)
    e["path"], e["bytes"] = new_name, size


def _assert_refused(r, *needles, rc=CONTENT) -> None:
    """Refused: the exit code `rc` allows, nothing on stdout, one "ckptbench: error:" line, no traceback."""
    assert r.rc in rc, r.err
    assert r.out == ""
    assert "Traceback" not in r.err
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error: "), r.err
    for n in needles:
        assert n in r.err_lines[0], r.err


def _regular_files(root):
    for dirpath, _, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            if stat.S_ISREG(os.lstat(full).st_mode):
                yield full


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _assert_nothing_written(tmp_path, in_dir=("crafted",)) -> None:
    """No OUT and no temporary sibling of it; the secret copied nowhere."""
    top = sorted(os.listdir(tmp_path))
    assert top == sorted(["in"] + (["secret"] if (tmp_path / "secret").exists() else [])), top
    assert sorted(os.listdir(tmp_path / "in")) == sorted(in_dir)
    for full in _regular_files(tmp_path):
        if full != str(tmp_path / "secret"):
            with open(full, "rb") as f:
                assert MARK not in f.read(), full


# ---- unpack: the pack file a manifest names -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlinked-dir"])
def test_unpack_never_copies_a_file_from_outside_the_checkpoint(h, packed, secret, tmp_path, how):
    """The issue's attack: a pack name that reaches a root-only (0600) file outside the checkpoint."""
    crafted = _crafted(packed, tmp_path)
    name = {"dotdot": "../../secret", "absolute": str(secret), "symlink": "evil.ckpack",
            "symlinked-dir": "up/secret"}[how]
    if how == "symlink":
        os.symlink(secret, os.path.join(crafted, "evil.ckpack"))
    elif how == "symlinked-dir":
        os.symlink(tmp_path, os.path.join(crafted, "up"))
    _edit(h, crafted, lambda m: _repoint_pack(m, "pack-00001-of-00004.ckpack", name, len(SECRET)))
    before = h.snapshot(crafted)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    if how in ("dotdot", "absolute"):
        _assert_refused(r, "plain relative path", rc=SCHEMA)
    else:
        _assert_refused(r, "outside", name)
    _assert_nothing_written(tmp_path)
    assert h.snapshot(crafted) == before
    assert secret.read_bytes() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_unpack_never_copies_a_kept_file_from_outside(h, packed, secret, tmp_path, how):
    crafted = _crafted(packed, tmp_path)
    shard = "model_rank000.pt"
    if how == "symlink":
        os.unlink(os.path.join(crafted, shard))
        os.symlink(secret, os.path.join(crafted, shard))
        new = shard
    else:
        new = "../../secret" if how == "dotdot" else str(secret)

    def change(man):
        e = _entry(man, shard)
        e["path"], e["bytes"] = new, len(SECRET)

    _edit(h, crafted, change)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    if how == "symlink":
        _assert_refused(r, "outside", shard)
    else:
        _assert_refused(r, "plain relative path", rc=SCHEMA)
    _assert_nothing_written(tmp_path)


# ---- unpack: member records ---------------------------------------------------------------------------------

LAST = "pack-00004-of-00004.ckpack"  # the last pack: on the old code every other pack was written before it failed


@pytest.mark.parametrize("record, needle, rc", [
    ([-1, 10, "small", 1], "whole number", SCHEMA),
    ([0, -1, "small", 1], "whole number", SCHEMA),
    (["0", 10, "small", 1], "whole number", SCHEMA),
    ([0.0, 10, "small", 1], "whole number", SCHEMA),
    ([True, 10, "small", 1], "whole number", SCHEMA),
    ([0, 10, "pack", 1], "kind", SCHEMA),
    ([0, 10, "small", -3], "rank", SCHEMA),
    ([0], "[offset, size, kind, rank]", SCHEMA),
    ("0:10", "[offset, size, kind, rank]", SCHEMA),
    ([0, 112727 + 1, "small", 1], "past the pack", CONTENT),
    ([112727, 1, "small", 1], "past the pack", CONTENT),
    ([2 ** 62, 2 ** 62, "small", 1], "past the pack", CONTENT),
])
def test_unpack_refuses_a_bad_member_record_before_writing(h, packed, tmp_path, record, needle, rc):
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    assert _entry(man, LAST)["bytes"] == 112727  # the sizes above are this pack's
    victim = sorted(man["packs"][LAST])[-1]
    man["packs"][LAST][victim] = record
    h.write_manifest(crafted, man)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    _assert_refused(r, needle, victim, rc=rc)
    _assert_nothing_written(tmp_path)


@pytest.mark.parametrize("shift", ["same", "inside", "straddle"])
def test_unpack_refuses_overlapping_members(h, packed, tmp_path, shift):
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    index = man["packs"][LAST]
    first, second = sorted(index, key=lambda rel: index[rel][0])
    off, size = index[first][:2]
    index[second][:2] = {"same": [off, size], "inside": [off + 1, 1], "straddle": [off + size - 1, 2]}[shift]
    h.write_manifest(crafted, man)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    _assert_refused(r, "overlap", first, second)
    _assert_nothing_written(tmp_path)


def test_members_that_only_touch_are_not_an_overlap(h, packed, tmp_path):
    """Control for the test above: adjacent members and an empty one at a boundary unpack fine."""
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    index = man["packs"][LAST]
    first = min(index, key=lambda rel: index[rel][0])
    index["empty.json"] = [index[first][1], 0, "small", None]
    h.write_manifest(crafted, man)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    assert r.rc == 0, r.err
    assert (tmp_path / "out" / "empty.json").read_bytes() == b""
    assert sorted(os.listdir(tmp_path)) == ["in", "out"]


@pytest.mark.parametrize("clash", ["member-in-two-packs", "member-is-a-kept-file", "member-is-the-manifest",
                                   "member-is-a-directory-of-another", "file-listed-twice"])
def test_unpack_refuses_a_name_given_twice(h, packed, tmp_path, clash):
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    packs = man["packs"]
    one = sorted(packs["pack-00001-of-00004.ckpack"])[0]
    other = sorted(packs[LAST])[0]
    if clash == "member-in-two-packs":
        packs[LAST][one] = packs[LAST].pop(other)
        name = one
    elif clash == "member-is-a-kept-file":
        name = "model_rank000.pt"
        packs[LAST][name] = packs[LAST].pop(other)
    elif clash == "member-is-the-manifest":
        name = h.MANIFEST
        packs[LAST][name] = packs[LAST].pop(other)
    elif clash == "member-is-a-directory-of-another":
        name = "dataloader"
        packs[LAST][name] = packs[LAST].pop(other)
    else:
        name = "model_rank000.pt"
        man["files"].append(dict(_entry(man, name)))
    h.write_manifest(crafted, man)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    _assert_refused(r, name, rc=SCHEMA if clash == "file-listed-twice" else CONTENT)
    _assert_nothing_written(tmp_path)


@pytest.mark.parametrize("what", ["pack", "kept"])
def test_unpack_refuses_a_fifo(h, packed, tmp_path, what):
    """Opening a FIFO blocks until a writer comes: the CLI runs in a child, so the old code's hang fails here."""
    crafted = _crafted(packed, tmp_path)
    name = "pack-00002-of-00004.ckpack" if what == "pack" else "model_rank001.pt"
    os.unlink(os.path.join(crafted, name))
    os.mkfifo(os.path.join(crafted, name))
    r = h.run_proc("unpack", crafted, tmp_path / "out", timeout=60)
    _assert_refused(r, "not a regular file", name)
    _assert_nothing_written(tmp_path)


@pytest.mark.parametrize("how", ["unlisted", "declared-bigger", "cut-short"])
def test_unpack_refuses_a_pack_whose_size_is_not_the_declared_one(h, packed, tmp_path, how):
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    e = _entry(man, LAST)
    if how == "unlisted":
        man["files"].remove(e)
    elif how == "declared-bigger":
        e["bytes"] += 1
    else:
        os.truncate(os.path.join(crafted, LAST), e["bytes"] - 1)
    h.write_manifest(crafted, man)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    _assert_refused(r, LAST)
    _assert_nothing_written(tmp_path)


def test_unpack_interrupted_while_writing_leaves_nothing(h, packed, tmp_path, monkeypatch):
    """A failure after the checks (here ^C while hashing the written files): the staging directory and the
    parents made for OUT are gone, OUT never appears."""
    from ckptbench.checkpoint import packs

    crafted = _crafted(packed, tmp_path)
    seen = []

    def interrupted(tmp, rels, alg):
        seen.append((tmp, sorted(os.listdir(tmp))))
        raise KeyboardInterrupt

    monkeypatch.setattr(packs, "_hashed", interrupted)
    r = h.run_cli("unpack", crafted, tmp_path / "a" / "b" / "out")
    assert r.rc == 130 and "interrupted" in r.err
    assert len(seen) == 1 and "model_rank000.pt" in seen[0][1]  # it was interrupted with files written
    assert os.path.basename(seen[0][0]) == f".out.tmp-{os.getpid()}"
    _assert_nothing_written(tmp_path)


def test_unpack_never_widens_permissions(h, packed, tmp_path):
    """A root-only file inside the checkpoint stays root-only when unpacked (and a root-only pack's members)."""
    crafted = _crafted(packed, tmp_path)
    os.chmod(os.path.join(crafted, "model_rank000.pt"), 0o600)
    os.chmod(os.path.join(crafted, "pack-00001-of-00004.ckpack"), 0o600)
    r = h.run_cli("unpack", crafted, tmp_path / "out")
    assert r.rc == 0, r.err
    members = h.read_manifest(crafted)["packs"]["pack-00001-of-00004.ckpack"]
    for rel in ["model_rank000.pt", *members]:
        assert stat.S_IMODE(os.stat(tmp_path / "out" / rel).st_mode) & 0o077 == 0, rel
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "model_rank001.pt").st_mode) == 0o644 & ~_umask()  # control


# ---- pack: sources named by the manifest ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_pack_never_reads_a_file_from_outside(h, ckpt, secret, tmp_path, how):
    crafted = _crafted(ckpt("torch", 4), tmp_path)
    if how == "symlink":
        os.unlink(os.path.join(crafted, "config.json"))
        os.symlink(secret, os.path.join(crafted, "config.json"))
        new = "config.json"
    else:
        new = "../../secret" if how == "dotdot" else str(secret)

    def change(man):
        e = _entry(man, "config.json")
        e["path"], e["bytes"] = new, len(SECRET)

    _edit(h, crafted, change)
    before = h.snapshot(crafted)
    r = h.run_cli("pack", crafted, tmp_path / "out")
    if how == "symlink":
        _assert_refused(r, "outside", "config.json")
    else:
        _assert_refused(r, "plain relative path", rc=SCHEMA)
    _assert_nothing_written(tmp_path)
    assert h.snapshot(crafted) == before


def test_pack_never_writes_outside_out(h, ckpt, tmp_path):
    """A kept shard named "../x": the old code copied it to OUT's parent, beside OUT."""
    crafted = _crafted(ckpt("torch", 4), tmp_path)
    outside = tmp_path / "in" / "outside.pt"
    outside.write_bytes(b"lure")

    def change(man):
        e = _entry(man, "model_rank000.pt")
        e["path"], e["bytes"] = "../outside.pt", 4

    _edit(h, crafted, change)
    r = h.run_cli("pack", crafted, tmp_path / "out")
    _assert_refused(r, "plain relative path", "../outside.pt", rc=SCHEMA)
    _assert_nothing_written(tmp_path, in_dir=("crafted", "outside.pt"))
    assert outside.read_bytes() == b"lure"


@pytest.mark.parametrize("how", ["fifo", "directory", "size-mismatch", "listed-twice", "negative-size"])
def test_pack_refuses_a_source_that_is_not_the_declared_file(h, ckpt, tmp_path, how):
    crafted = _crafted(ckpt("torch", 4), tmp_path)
    man = h.read_manifest(crafted)
    e = _entry(man, "tokenizer.json")
    rc = CONTENT
    if how == "fifo":
        os.unlink(os.path.join(crafted, "tokenizer.json"))
        os.mkfifo(os.path.join(crafted, "tokenizer.json"))
        needles = ["not a regular file", "tokenizer.json"]
    elif how == "directory":
        os.mkdir(os.path.join(crafted, "emptydir"))
        e["path"] = "emptydir"
        needles = ["not a regular file", "emptydir"]
    elif how == "size-mismatch":
        e["bytes"] += 1
        needles = ["the checkpoint says", "tokenizer.json"]
    elif how == "listed-twice":
        man["files"].append(dict(e))
        needles, rc = ["tokenizer.json"], SCHEMA
    else:
        e["bytes"] = -5
        needles, rc = ["whole number", "-5"], SCHEMA
    h.write_manifest(crafted, man)
    r = h.run_proc("pack", crafted, tmp_path / "out", timeout=60)  # a child: a FIFO would hang the old code
    _assert_refused(r, *needles, rc=rc)
    _assert_nothing_written(tmp_path)


def test_pack_never_widens_permissions(h, ckpt, tmp_path):
    crafted = _crafted(ckpt("torch", 4), tmp_path)
    os.chmod(os.path.join(crafted, "dataloader/rank000_worker0000.idx"), 0o600)
    os.chmod(os.path.join(crafted, "model_rank000.pt"), 0o600)
    r = h.run_cli("pack", crafted, tmp_path / "out", "--target-files", "1")
    assert r.rc == 0, r.err
    for rel in ["pack-00001-of-00001.ckpack", "model_rank000.pt"]:
        assert stat.S_IMODE(os.stat(tmp_path / "out" / rel).st_mode) & 0o077 == 0, rel
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "model_rank001.pt").st_mode) == 0o644 & ~_umask()  # control


# ---- the loader's member reads ------------------------------------------------------------------------------


def _read_member_in_child(crafted: str, rel: str) -> subprocess.CompletedProcess:
    """members.read_member in a fresh interpreter (a FIFO would block this one): prints the bytes' length, or the
    error's exit code and line."""
    code = ("import sys\nfrom ckptbench.checkpoint import manifest, members\nfrom ckptbench.core.errors import CkptbenchError\n"
            "d, rel = sys.argv[1], sys.argv[2]\n"
            "try:\n    print(len(members.read_member(d, manifest.read(d), rel)))\n"
            "except CkptbenchError as exc:\n    print(f'error {exc.exit_code} {exc}')\n")
    return subprocess.run([sys.executable, "-c", code, crafted, rel], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how, needle, rc", [
    ("dotdot", "plain relative path", SCHEMA), ("absolute", "plain relative path", SCHEMA),
    ("negative", "whole number", SCHEMA), ("symlink", "outside", CONTENT), ("fifo", "not a regular file", CONTENT),
    ("past-the-pack", "past the pack", CONTENT), ("unlisted", "not listed", CONTENT),
    ("declared-bigger", "the checkpoint says", CONTENT),
])
def test_read_member_goes_through_confine(h, packed, secret, tmp_path, how, needle, rc):
    crafted = _crafted(packed, tmp_path)
    man = h.read_manifest(crafted)
    pack_file = "pack-00001-of-00004.ckpack"
    size = _entry(man, pack_file)["bytes"]
    if how in ("dotdot", "absolute", "symlink"):
        name = {"dotdot": "../../secret", "absolute": str(secret), "symlink": "evil.ckpack"}[how]
        if how == "symlink":
            os.symlink(secret, os.path.join(crafted, name))
        _repoint_pack(man, pack_file, name, len(SECRET))
    elif how == "fifo":
        os.unlink(os.path.join(crafted, pack_file))
        os.mkfifo(os.path.join(crafted, pack_file))
    elif how == "past-the-pack":
        man["packs"][pack_file][MEMBER] = [size - 4, 5, "small", None]
    elif how == "negative":
        man["packs"][pack_file][MEMBER] = [-1, 5, "small", None]
    elif how == "unlisted":
        man["files"].remove(_entry(man, pack_file))
    else:
        _entry(man, pack_file)["bytes"] = size + 1
    h.write_manifest(crafted, man)
    p = _read_member_in_child(crafted, MEMBER)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert any(p.stdout.startswith(f"error {code} ") for code in rc) and needle in p.stdout, p.stdout
    assert MARK.decode() not in p.stdout


def test_read_member_of_a_sound_pack_is_the_member(h, packed, ckpt):
    """Control for the test above: the same call on the untouched pack gives the original file's bytes."""
    from ckptbench.checkpoint import manifest
    from ckptbench.checkpoint import members

    man = manifest.read(packed)
    src = ckpt("torch", 4)
    for rel in ["config.json", "tokenizer.json", "dataloader/rank002_worker0000.idx"]:
        with open(os.path.join(src, rel), "rb") as f:
            assert members.read_member(packed, man, rel) == f.read(), rel
    assert json.loads(members.read_member(packed, man, "config.json"))["n_layer"] > 0


# ---- packs' own checks, on a Manifest that did not come through manifest.parse --------------------------------


@pytest.mark.parametrize("pack_file, rel, record, needle", [
    ("../x.ckpack", MEMBER, [0, 1, "small", None], "plain relative path"),
    ("/abs.ckpack", MEMBER, [0, 1, "small", None], "plain relative path"),
    ("pack-00001-of-00004.ckpack", "../" + MEMBER, [0, 1, "small", None], "plain relative path"),
    ("pack-00001-of-00004.ckpack", "a//b", [0, 1, "small", None], "plain relative path"),
    ("pack-00001-of-00004.ckpack", MEMBER, [-1, 1, "small", None], "whole numbers"),
    ("pack-00001-of-00004.ckpack", MEMBER, [0, "1", "small", None], "whole numbers"),
    ("pack-00001-of-00004.ckpack", MEMBER, [False, 1, "small", None], "whole numbers"),
    ("pack-00001-of-00004.ckpack", MEMBER, [0, PACK1_BYTES + 1, "small", None], "past the pack"),
    ("pack-00001-of-00004.ckpack", MEMBER, [0, 1, "pack", None], "kind"),
    ("pack-00001-of-00004.ckpack", MEMBER, [0, 1, "small", True], "rank"),
    ("pack-00001-of-00004.ckpack", MEMBER, {"offset": 0}, "record"),
])
def test_packs_check_records_themselves(packed, pack_file, rel, record, needle):
    from dataclasses import replace

    from ckptbench.checkpoint import manifest
    from ckptbench.checkpoint import members
    from ckptbench.core.errors import CkptbenchError

    man = manifest.read(packed)
    assert [e.bytes for e in man.files if e.path == "pack-00001-of-00004.ckpack"] == [PACK1_BYTES]
    files = tuple(replace(e, path=pack_file) if e.path == "pack-00001-of-00004.ckpack" else e for e in man.files)
    crafted = replace(man, files=files, packs={pack_file: {rel: record}})
    for call in (lambda: members.pack_tables(packed, crafted), lambda: members.read_member(packed, crafted, rel)):
        with pytest.raises(CkptbenchError) as info:
            call()
        assert info.value.exit_code == 1 and needle in str(info.value) and "\n" not in str(info.value)


def test_packs_table_not_a_mapping_is_refused(packed):
    from dataclasses import replace

    from ckptbench.checkpoint import manifest
    from ckptbench.checkpoint import members
    from ckptbench.core.errors import CkptbenchError

    man = manifest.read(packed)
    for table in ([1, 2], {"pack-00001-of-00004.ckpack": ["config.json"]}):
        with pytest.raises(CkptbenchError) as info:
            members.read_member(packed, replace(man, packs=table), "config.json")
        assert info.value.exit_code == 1 and "packs table" in str(info.value)
