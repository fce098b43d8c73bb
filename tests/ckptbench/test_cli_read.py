"""`ckptbench read` and the CLI's face: JSON contents, cache conditions, bad input, start-up imports."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from ckptbench import __version__


def ckptbench(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def fileset(tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("set")
    contents = {}
    for i, size in enumerate([0, 1, 4097, 3 << 20, (1 << 20) + 7]):
        path = root / ("sub" if i % 2 else "") / f"f{i}.bin"
        path.parent.mkdir(exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        contents[str(path)] = data
    return contents


def root_of(fileset) -> str:
    return os.path.commonpath(list(fileset))


def test_version_and_help():
    assert ckptbench("--version", check=True).stdout.strip() == f"ckptbench {__version__}"
    help_text = ckptbench("--help", check=True).stdout
    assert "read" in help_text and "demo" in help_text


@pytest.mark.parametrize("alg", ["md5", "sha256"])
def test_read_json_digests_match_hashlib(fileset, alg):
    doc = json.loads(ckptbench("read", root_of(fileset), "--hash", alg, "-c", "3", "--json", check=True).stdout)
    assert doc["bytes"] == sum(len(d) for d in fileset.values())
    assert doc["read_gbps"] == pytest.approx(doc["bytes"] / doc["seconds"] / 1e9)
    by_path = {f["path"]: f for f in doc["files"]}
    assert set(by_path) == set(fileset)
    for path, data in fileset.items():
        assert by_path[path]["digest"] == hashlib.new(alg, data).hexdigest()
        assert by_path[path]["bytes"] == len(data)
        assert by_path[path]["error"] is None
    assert doc["cache"]["requested"] == "as-is"
    assert 0.0 <= doc["cache"]["residency_before"] <= 1.0


def test_cold_is_verified_cold_and_hot_is_verified_hot(fileset):
    cold = json.loads(ckptbench("read", root_of(fileset), "--cache", "cold", "--read", "pread", "--json",
                                check=True).stdout)["cache"]
    assert cold["requested"] == "cold" and cold["verified"] is True
    assert cold["residency_before"] <= 0.05
    assert cold["residency_after"] >= 0.95  # the read itself brought the pages in
    hot = json.loads(ckptbench("read", root_of(fileset), "--cache", "hot", "--json", check=True).stdout)["cache"]
    assert hot["requested"] == "hot" and hot["verified"] is True
    assert hot["residency_before"] >= 0.95


def test_auto_reads_cold_files_direct_and_cached_files_with_pread(fileset):
    """The default picks O_DIRECT for a cold read (the page cache stays cold) and pread for a hot one, and says why."""
    cold = json.loads(ckptbench("read", root_of(fileset), "--cache", "cold", "--json", check=True).stdout)
    assert cold["read"] == "direct" and "O_DIRECT works" in cold["read_why"]
    assert cold["cache"]["residency_after"] <= 0.05  # direct reads bypass the page cache
    hot = json.loads(ckptbench("read", root_of(fileset), "--cache", "hot", "--json", check=True).stdout)
    assert hot["read"] == "pread" and "page cache" in hot["read_why"]


def test_auto_falls_back_to_pread_where_o_direct_is_refused(tmp_path, monkeypatch):
    """A filesystem that refuses O_DIRECT (older tmpfs, some FUSE mounts) gets pread, and the reason says so;
    so does a block size O_DIRECT cannot use. The refusal is the kernel's EINVAL, injected at os.open."""
    import errno

    from ckptbench.system import readmode

    disk = tmp_path / "f.bin"
    disk.write_bytes(b"x" * 10000)
    assert readmode.choose([(str(disk), 10000)], 0.0, 1 << 20).mode == "direct"
    assert readmode.choose([(str(disk), 10000)], 0.9, 1 << 20).mode == "pread"  # mostly cached
    unaligned = readmode.choose([(str(disk), 10000)], 0.0, 1000)
    assert unaligned.mode == "pread" and "block size 1000" in unaligned.why
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    choice = readmode.choose([(str(disk), 10000)], 0.0, 1 << 20)
    assert choice.mode == "pread" and "refuses O_DIRECT (Invalid argument)" in choice.why


def test_files_named_one_by_one_in_direct_mode(fileset):
    paths = sorted(fileset)[:3]
    doc = json.loads(ckptbench("read", *paths, "--read", "direct", "--hash", "xxh64", "--json", check=True).stdout)
    assert [f["path"] for f in doc["files"]] == paths


@pytest.mark.parametrize(
    "args, needle",
    [
        (["read", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such file or directory"),
        (["read", "{root}", "--concurrency", "0"], "must be 1..1024"),
        (["read", "{root}", "--hash", "crc64"], "invalid choice: 'crc64'"),
        (["read", "{root}", "--block-size", "lots"], "not a size"),
        (["read", "{root}", "--read", "direct", "--block-size", "6144"], "multiple of 4096"),
        (["read", "{empty}"], "holds no files"),
    ],
)
def test_bad_input_gets_one_clear_line(fileset, tmp_path, args, needle):
    args = [a.format(root=root_of(fileset), empty=tmp_path) for a in args]
    proc = ckptbench(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_special_file_is_refused_up_front(tmp_path):
    good = tmp_path / "good.bin"
    good.write_bytes(b"x" * 10000)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    proc = ckptbench("read", str(good), str(fifo), "--json")
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and proc.stdout == ""


def test_file_failing_mid_run_is_reported_with_errno_and_exit_1(tmp_path, monkeypatch, capsys):
    import fastio
    from ckptbench.cli import root as cli
    from ckptbench.sources import local

    good = tmp_path / "good.bin"
    good.write_bytes(os.urandom(70000))
    gone = tmp_path / "gone.bin"
    gone.write_bytes(b"y" * 100)
    listed = local.LocalSource([str(tmp_path)]).list()
    gone.unlink()  # vanishes between the list and the read
    monkeypatch.setattr(local.LocalSource, "list", lambda self: listed)
    assert cli.main(["read", str(tmp_path), "--hash", "md5", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    by_path = {f["path"]: f for f in doc["files"]}
    assert by_path[str(gone)]["error"]["errno"] == 2 and by_path[str(gone)]["digest"] is None
    assert by_path[str(good)]["digest"] == hashlib.md5(good.read_bytes()).hexdigest()
    assert doc["files_failed"] == 1 and doc["files_ok"] == 1
    assert isinstance(listed.files[0], fastio.FileSpec)


def test_headless_start_imports_no_torch_boto3_or_textual(fileset):
    code = (
        "import sys; from ckptbench.cli.root import main; rc = main(['read', sys.argv[1], '--json']);"
        "bad = [m for m in ('torch', 'boto3', 'textual') if m in sys.modules]; print(bad, file=sys.stderr);"
        "sys.exit(rc or bool(bad))"
    )
    proc = subprocess.run([sys.executable, "-c", code, root_of(fileset)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("[]")


def test_demo_generates_the_sample_once_and_restores_it(tmp_path):
    target = tmp_path / "demo"
    first = ckptbench("demo", "--dir", str(target), "--headless", "--scale", "0.02", check=True)
    assert "generating the small sample checkpoint" in first.stderr
    assert "RTO" in first.stdout and "success 100 %" in first.stdout
    manifest = json.loads((target / "ckptbench.json").read_text())
    assert {f["path"] for f in manifest["files"]} <= {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    second = ckptbench("demo", "--dir", str(target), "--headless", "--scale", "0.02", check=True)
    assert "generating" not in second.stderr
    assert not list(tmp_path.glob(".demo.tmp-*"))


def test_a_block_size_off_the_page_size_reads_with_pread_and_its_chunks_stay_whole_pages():
    """--block-size 4097 was refused over a chunk size the user never set."""
    from ckptbench.sources.base import ReadOptions

    for block in (4097, 6144, 12345, 1 << 20):
        r = ReadOptions(block_size=block, read="pread")
        assert r.chunk_size % block == 0 and r.chunk_size % 4096 == 0 and 32 << 20 <= r.chunk_size <= 96 << 20
