"""The package as users get it: an sdist built from a clean copy of the repository, a wheel built from that
sdist, installed with pip into a fresh virtualenv outside the repository, and run from outside it.

The virtualenv gets the wheel alone (`--no-deps`); its third-party dependencies (torch and the rest, gigabytes)
come from this test run's environment through a plain path line in a .pth file, which adds that directory
without running the .pth files inside it, so the repository's editable install stays invisible: `ckptbench`
can only be imported from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME = {"textual", "rich", "torch", "safetensors", "numpy", "psutil", "boto3", "awscrt"}


def _sh(*cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _clean_copy(dest) -> None:
    """What a fresh clone holds: tracked files plus new files git does not ignore (no build outputs)."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, names):
        src = os.path.join(REPO, os.fsdecode(name))
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(os.fsdecode(name))), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, os.fsdecode(name)))


def _build(kind: str, src, out) -> str:
    """The PEP 517 backend the pyproject names, without isolation: the pinned build tools already installed."""
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    return os.path.join(out, _sh(sys.executable, "-c", code, cwd=src).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, wheel path, a working directory outside the repository)."""
    root = tmp_path_factory.mktemp("wheel")
    _clean_copy(root / "clone")
    sdist = _build("sdist", root / "clone", root / "dist")
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    (top,) = os.listdir(root / "unpacked")
    wheel = _build("wheel", root / "unpacked" / top, root / "dist")
    venv = root / "venv"
    _sh(sys.executable, "-m", "venv", venv, cwd=root)
    py = venv / "bin" / "python"
    _sh(py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=root)
    site = _sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).stdout.strip()
    with open(os.path.join(site, "zz_test_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    work = root / "elsewhere"
    work.mkdir()
    return py, wheel, work


def _cli(installed, *args, env_extra=None):
    py, _, work = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=str(work), XDG_CACHE_HOME=str(work / "cache"), **(env_extra or {}))
    return subprocess.run([str(py.parent / "ckptbench"), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)


def test_wheel_holds_every_package_the_profiles_and_the_stylesheet(installed):
    _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("ckptbench/sources/__init__.py", "ckptbench/sources/s3source.py", "ckptbench/checkpoint/formats/__init__.py",
                 "ckptbench/profile_data/checkpoints/7b.toml", "ckptbench/profile_data/storage/s3.toml",
                 "tui/app.tcss", "tui/screens/dashboard.py", "fastio/_engine.pyi", "fastio/py.typed",
                 "ckptbench/py.typed"):
        assert must in names, must
    assert any(n.startswith("fastio/_engine.") and n.endswith(".so") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
    required = {line.split()[1].split(";")[0].split("[")[0].lower() for line in meta.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert required == RUNTIME
    assert "moto" not in required  # the local S3 server is an extra, not a runtime dependency


def test_installed_package_is_imported_from_the_venv(installed):
    py, _, work = installed
    out = _sh(py, "-c", "import ckptbench, fastio, tui; print(ckptbench.__file__, fastio.__file__, tui.__file__)",
              cwd=work).stdout.split()
    venv = str(py.parent.parent)
    assert all(p.startswith(venv) for p in out), out
    assert not any(p.startswith(REPO) for p in out)


def test_version_and_plan_from_the_wheel(installed):
    r = _cli(installed, "--version")
    assert r.returncode == 0 and r.stdout.strip() == "ckptbench 0.1.0", r.stderr
    r = _cli(installed, "plan", "7b", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["profile"] == "7b" and 6e9 < doc["params"] < 8e9


def test_gen_and_run_from_the_wheel(installed):
    _, _, work = installed
    ckpt, results = work / "ckpt", work / "results.csv"
    r = _cli(installed, "gen", "small", str(ckpt), "--scale", "0.02")
    assert r.returncode == 0, r.stderr
    r = _cli(installed, "run", str(ckpt), "--repeat", "1", "--cache", "cold", "--json", "--results", str(results))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok" and doc["success_rate"] == 1.0 and doc["bytes"] > 0
    assert doc["stages"]["read"] > 0 and doc["rto_s"] >= sum(v for v in doc["stages"].values() if v)
    assert results.read_text().count("\n") == 2  # the header and this run's one repeat


def test_demo_s3_without_its_extra_names_the_extra(installed):
    py, _, work = installed
    code = ("import sys; sys.modules['moto'] = None; from ckptbench.cli.root import main; "
            "sys.exit(main(['demo', '--s3', '--headless']))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(HOME=str(work), XDG_CACHE_HOME=str(work / "cache"))
    r = subprocess.run([str(py), "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ckptbench[s3-demo]" in lines[0], r.stderr
    assert not (work / "cache" / "ckptbench").exists()  # refused before generating anything
