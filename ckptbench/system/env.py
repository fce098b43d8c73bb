"""The environment a run is recorded with: versions, kernel, CPU, memory, instance, the source's mount, limits."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from importlib import metadata

from ckptbench import __version__
from ckptbench.system import probes

# Figures measured on machines that differ in these are not comparable without saying so.
KEY_FIELDS = ("tool_version", "python", "torch", "safetensors", "kernel", "cpu_model", "cpu_count", "source_fs")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _plain(value):
    return str(value) if isinstance(value, probes.Unknown) else value


def snapshot(source: str | None = None, root: str = "/") -> dict:
    """Never imports the packages it reports on (textual, boto3): their installed versions come from metadata."""
    mem = probes.meminfo(root)
    nofile = probes.ulimit_nofile(root)
    env = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "safetensors": _version("safetensors"),
        "boto3": _version("boto3"),
        "textual": _version("textual"),
        "kernel": probes.kernel(),
        "cpu_model": _plain(probes.cpu_model(root)),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": mem.get("MemTotal") if isinstance(mem, dict) else str(mem),
        "instance_type": _plain(probes.instance_type(root)),
        "ulimit_nofile": list(nofile) if isinstance(nofile, tuple) else str(nofile),
        "vm_dirty_ratio": _plain(probes.sysctl("vm.dirty_ratio", root)),
        "vm_dirty_background_ratio": _plain(probes.sysctl("vm.dirty_background_ratio", root)),
        "executable": sys.executable,
    }
    if source is not None:
        m = probes.mount_of(source, root)
        if isinstance(m, probes.Mount):
            env.update(source_fs=m.fs_type, source_mount=m.mount_point, source_mount_options=m.options,
                       read_ahead_kb=_plain(probes.read_ahead_kb(m.device, root)))
        else:
            env.update(source_fs=str(m), source_mount=None, source_mount_options=None, read_ahead_kb=None)
    return env
