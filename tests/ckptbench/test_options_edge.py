"""Options are checked at the edge: every size, count and number a user types is refused in one line before
any work starts, and no NaN or infinity ever reaches a document."""

from __future__ import annotations

import pytest

from clirun import run_proc


@pytest.mark.parametrize("args, needle", [
    (["plan", "small", "--interval", "0"], "--interval"),
    (["plan", "small", "--interval", "-5"], "--interval"),
    (["plan", "small", "--interval", "nan"], "--interval"),
    (["plan", "small", "--scale", "nan"], "--scale"),
    (["plan", "small", "--scale", "1e300"], "--scale"),
    (["gen", "small", "{tmp}/g", "--scale", "inf"], "--scale"),
    (["compare", "{tmp}/r.csv", "--threshold", "nan"], "--threshold"),
    (["read", "{tmp}", "--chunk-size", "100T"], "--chunk-size"),
    (["read", "{tmp}", "--block-size", "2G"], "--block-size"),
    (["read", "{tmp}", "--part-size", "0"], "--part-size"),
    (["read", "{tmp}", "-c", "0"], "--concurrency"),
    (["sweep", "{tmp}", "--levels", "0,4"], "--levels"),
    (["sweep", "{tmp}", "--block-size", "6K", "--read", "direct"], "multiple of 4096"),
    (["run", "{tmp}", "--price-per-hour", "nan"], "--price-per-hour"),
    (["run", "{tmp}", "--repeat", "0"], "--repeat"),
    # int() and float() take other scripts' digits and underscores; a user means neither
    (["read", "{tmp}", "-c", "\u0661\u0662"], "--concurrency"),
    (["run", "{tmp}", "--repeat", "1_0"], "--repeat"),
    (["plan", "small", "--interval", "\u0661\u0662"], "--interval"),
    (["plan", "small", "--scale", "0_5"], "--scale"),
    (["read", "{tmp}", "--block-size", "\u0661M"], "--block-size"),
    (["sweep", "{tmp}", "--levels", "1,1_6"], "--levels"),
    (["run", "{tmp}", "--device", "cuda:\u00b2"], "--device"),
])
def test_bad_numbers_are_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "f.bin").write_bytes(b"x" * 10)
    r = run_proc(*[a.format(tmp=tmp_path) for a in args])
    assert r.rc == 2, (r.out, r.err)
    lines = [line for line in r.err.splitlines() if line.strip() and not line.startswith("usage:")
             and not line.startswith("   ")]
    assert len(lines) == 1 and needle in lines[0], r.err
    assert "Traceback" not in r.err and r.out == ""
    assert not (tmp_path / "g").exists()


def test_run_options_hold_one_read_options():
    """A restore's read settings live in its ReadOptions, declared and checked there once; the flat view documents
    record names each once, and a change goes to where the setting is declared."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.restore.runner import RunOptions
    from ckptbench.sources import ReadOptions

    o = RunOptions.make(mode="staged", concurrency=3, read="mmap", block_size=4 << 20, hash="sha256")
    assert isinstance(o.reading, ReadOptions) and o.reading.concurrency == 3 and o.concurrency == 3
    assert o.hash == "sha256" and o.read_options("sha256").hash == "sha256"
    assert o.settings() == {"mode": "staged", "cache": "as-is", "hash": "sha256", "device": "cpu",
                            "drop_caches": False, "optimizer_step": False, "stage_dir": None, "concurrency": 3,
                            "read": "mmap", "block_size": 4 << 20, "part_size": 8 << 20, "s3_client": "threads"}
    # a new block size derives the chunk size again (64 MiB is not a multiple of 3 MiB)
    assert o.but(block_size=3 << 20).reading.chunk_size % (3 << 20) == 0
    assert o.but(concurrency=5).concurrency == 5 and o.concurrency == 3
    assert RunOptions().read == "auto"  # a restore picks its read path per repeat unless told
    with pytest.raises(CkptbenchError, match="--block-size"):
        o.but(read="direct", block_size=4097)
    with pytest.raises(TypeError, match="not a restore setting"):
        o.but(concurency=2)


def test_aws_max_attempts_in_other_digits_is_not_taken(monkeypatch):
    """'²'.isdigit() holds and int('²') raises: the environment's value is botocore's to refuse, never a traceback."""
    from ckptbench.sources import s3

    for raw in ("\u00b2", "\u0661\u0662"):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", raw)
        assert "total_max_attempts" not in s3._retries(None), raw
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    assert s3._retries(None)["total_max_attempts"] == 7
