"""Where the S3 benchmark's peers come from: the `aws` CLI on PATH or in a venv under /tmp, s3torchconnector in
that venv (never with a CUDA torch), Run:ai's S3 backend from this venv's `bench` extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from _harness import log

PEER_VENV = os.path.join(tempfile.gettempdir(), "ckptbench-s3peers")


def find_aws(env: dict) -> tuple[str | None, str]:
    """The `aws` on PATH, or one installed into a venv under /tmp; (path or None, how or why not)."""
    aws = shutil.which("aws")
    if aws:
        out = subprocess.run([aws, "--version"], capture_output=True, text=True, env=env, check=False)
        if out.returncode == 0:
            return aws, (out.stdout or out.stderr).strip()
    venv_aws = os.path.join(PEER_VENV, "bin", "aws")
    if not os.path.exists(venv_aws):
        log(f"aws not found: installing awscli into {PEER_VENV}")
        err = ensure_venv() or pip_install(["awscli"])
        if err:
            return None, f"not installed: {err}"
    out = subprocess.run([venv_aws, "--version"], capture_output=True, text=True, env=env, check=False)
    return (venv_aws, (out.stdout or out.stderr).strip()) if out.returncode == 0 else (None, "not installed: broken")


def ensure_venv() -> str | None:
    if os.path.exists(os.path.join(PEER_VENV, "bin", "python")):
        return None
    out = subprocess.run([sys.executable, "-m", "venv", PEER_VENV], capture_output=True, text=True, check=False)
    return None if out.returncode == 0 else f"venv failed: {out.stderr.strip()[-200:]}"


def pip_install(pkgs: list[str]) -> str | None:
    out = subprocess.run([os.path.join(PEER_VENV, "bin", "pip"), "install", "--quiet", *pkgs],
                         capture_output=True, text=True, check=False)
    return None if out.returncode == 0 else f"pip install {' '.join(pkgs)} failed: {out.stderr.strip()[-200:]}"


def pip_plan(pkgs: list[str]) -> tuple[list[tuple[str, str]] | None, str]:
    """What `pip install pkgs` would install into the peer venv (a dry run), as (name, version) pairs."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = f.name
    try:
        out = subprocess.run([os.path.join(PEER_VENV, "bin", "pip"), "install", "--dry-run", "--quiet", "--report",
                              report, *pkgs], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return None, out.stderr.strip().splitlines()[-1][:200] if out.stderr.strip() else "pip failed"
        with open(report) as f:
            r = json.load(f)
        return [(i["metadata"]["name"], i["metadata"]["version"]) for i in r.get("install", [])], ""
    finally:
        os.unlink(report)


def find_runai() -> tuple[bool, str]:
    """runai-model-streamer-s3 in this venv (the `bench` extra); (usable, its version or why not)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import runai_model_streamer  # noqa: F401
        import runai_model_streamer_s3  # noqa: F401
    except ImportError as exc:
        return False, f"not installed ({exc.name}): pip install -c constraints.txt -e '.[bench]'"
    try:
        return True, f"runai-model-streamer-s3 {version('runai-model-streamer-s3')} in {sys.prefix}"
    except PackageNotFoundError:
        return True, "runai-model-streamer-s3 (version unknown)"


def find_s3torch() -> tuple[str | None, str]:
    """s3torchconnector in the /tmp peer venv, installed there if needed, never with a CUDA torch (gigabytes).

    The unpinned install resolves to the newest torch, which drags in the CUDA wheels; so the plan is checked
    with a dry run and torch is pinned to the CPU build the project's venv uses (a local wheel here) when needed.
    """
    python = os.path.join(PEER_VENV, "bin", "python")
    probe = ("import s3torchconnector, s3torchconnectorclient, torch; "
             "print(s3torchconnectorclient.__version__, torch.__version__)")
    if os.path.exists(python):
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            v, tv = out.stdout.split()
            return python, f"s3torchconnector {v} (torch {tv}) in {PEER_VENV}"
    err = ensure_venv()
    if err:
        return None, f"not installed: {err}"
    attempts = [["s3torchconnector"]]
    try:
        import torch

        if "+cpu" in torch.__version__:
            attempts.insert(0, ["s3torchconnector", f"torch=={torch.__version__}"])
    except ImportError:
        pass
    why = "no plan"
    for pkgs in attempts:
        plan, err = pip_plan(pkgs)
        if plan is None:
            why = err
            continue
        heavy = [n for n, _ in plan if n.lower().startswith(("nvidia-", "triton", "cuda-"))]
        if heavy:
            torch_v = dict((n.lower(), v) for n, v in plan).get("torch", "?")
            why = f"would pull torch {torch_v} with {len(heavy)} CUDA packages (gigabytes)"
            continue
        log(f"installing {' '.join(pkgs)} into {PEER_VENV}")
        err = pip_install(pkgs)
        if err:
            why = err
            continue
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            v, tv = out.stdout.split()
            return python, f"s3torchconnector {v} (torch {tv}) in {PEER_VENV}"
        why = f"import failed: {out.stderr.strip()[-200:]}"
    return None, f"not installed: {why}"
