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
