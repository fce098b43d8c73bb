"""The CLI run in this process or as a fresh interpreter, for the tests: exit code, stdout, stderr."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Run:
    rc: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def run_cli(*args: str) -> Run:
    """The CLI in this process (torch is imported once): exit code, stdout, stderr."""
    from ckptbench.cli import root as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as exc:  # argparse errors
            rc = exc.code if isinstance(exc.code, int) else 1
    return Run(rc, out.getvalue(), err.getvalue())


def run_proc(*args: str, timeout: int = 120, env: dict | None = None) -> Run:
    """The CLI as a user runs it: a fresh interpreter (with `env` added to this environment)."""
    proc = subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ) | env if env else None)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(r: Run, needle: str = "", rc: int = 2) -> None:
    """Bad input: exit 2 (1 where the system refused a place: docs/reference.md's exit status), nothing on stdout,
    one "ckptbench: error:" line naming `needle`, no traceback."""
    assert r.rc == rc, (r.rc, r.err)
    assert r.out == ""
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error: ") and needle in r.err_lines[0]
    assert "Traceback" not in r.err


def one_error_line(r: Run, *needles: str) -> str:
    """A refusal that may come after output (a failed restore's exit 1 as much as bad input's 2): a non-zero exit, no
    traceback, one "ckptbench: error:" line holding every needle; that line."""
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(errors) == 1, r.err
    for n in needles:
        assert n in errors[0], (n, r.err)
    return errors[0]
