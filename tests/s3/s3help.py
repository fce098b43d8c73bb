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


def run_cli(*args) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from ckptbench.cli import root as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc, err: str, *needles: str, code: int | None = 2) -> str:
    """Bad input: exit `code` (None: any but 0; a confinement refusal is 1), one "ckptbench: error:" line naming
    each of `needles`, no traceback; the line."""
    assert "Traceback" not in err, err
    assert rc != 0 if code is None else rc == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ckptbench: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
