"""What the peers benchmark reads from its children: a child's JSON document, what it takes from `ckptbench run
--json` (the RTO, the stages, the read path and hash the run used), the `ckptbench read` command that repeats that
read path, and the checks on a peer's state dict and on a read against the generator's figures."""

from __future__ import annotations

import json
import os
import re
import sys

READ_MODES = ("pread", "mmap", "direct")


def parse_child(returncode: int, stdout: str, stderr: str) -> tuple[dict | None, str]:
    """A child's JSON document (the whole of stdout, else its last line) and a problem line ("" when none)."""
    doc = None
    text = stdout.strip()
    for candidate in (text, text.splitlines()[-1] if text else ""):
        try:
            doc = json.loads(candidate)
            break
        except json.JSONDecodeError:
            continue
    if not isinstance(doc, dict):
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
        return None, f"exited {returncode} without a JSON document: {tail[:300]}"
    return doc, "" if returncode == 0 else f"exited {returncode}"


def run_summary(doc: dict) -> dict:
    """What the bench takes from `ckptbench run --json`: the RTO, the stages, the cache state and the read path."""
    opts = doc.get("options", {})
    stages = doc.get("stages", {})
    read_mode, why = resolved_read(doc)
    hash_, hash_how = resolved_hash(doc)
    return {"rto": doc.get("rto_s"), "read": stages.get("read"), "check": stages.get("check"), "stages": stages,
            "residency": doc.get("cache", {}).get("residency_before"), "status": doc.get("status"),
            "bytes": doc.get("bytes"), "mode": opts.get("mode"), "read_option": opts.get("read"),
            "read_mode": read_mode, "read_why": why,
            "hash": hash_, "hash_how": hash_how, "concurrency": opts.get("concurrency"),
            "block_size": opts.get("block_size"), "verified": doc.get("verified"), "warmup_s": doc.get("warmup_s"),
            "fresh_gbps_per_core": met_rate(doc)}


def met_rate(doc: dict) -> float | None:
    """The fresh-memory rate the run's repeats met, per core of CPU time (fastio's workers in MADV_POPULATE_WRITE,
    each repeat's `populated`): the median over those that populated enough to time, or None (an O_DIRECT read
    populates nothing of its own)."""
    import statistics

    from ckptbench.system.floor import populate_rate

    rates = []
    for rep in doc.get("repeats") or []:
        p = rep.get("populated") if isinstance(rep.get("populated"), dict) else {}
        n, cpu = p.get("bytes"), p.get("cpu_s")
        if isinstance(n, int) and isinstance(cpu, (int, float)) and (x := populate_rate(n, cpu)) is not None:
            rates.append(x)
    return statistics.median(rates) if rates else None


def resolved_read(doc: dict) -> tuple[str | None, str]:
    """The read mode the run used and why: its option when concrete, else what it says `auto` picked (the run's
    `read.modes` when one, else its first repeat's `read.mode`); None when it says neither (`ckptbench read` then
    keeps its own default)."""
    mode = doc.get("options", {}).get("read")
    if mode in READ_MODES:
        return mode, "set"
    read = doc.get("read") if isinstance(doc.get("read"), dict) else {}
    repeats = doc.get("repeats") or [{}]
    first = repeats[0].get("read") if isinstance(repeats[0].get("read"), dict) else {}
    modes = read.get("modes") or []
    mode = modes[0] if len(modes) == 1 else first.get("mode")
    return (mode, read.get("why") or first.get("why") or "") if mode in READ_MODES else (None, "not reported")


def resolved_hash(doc: dict) -> tuple[str, str]:
    """The digest the run's read stage computed, and how that is known: none when staged (it hashes in verify);
    else the --hash option; else what the verify note says a run without a manifest did ("not computed", or
    "computed (ALG)"); else crc32c, the default before the run said which."""
    opts = doc.get("options", {})
    if opts.get("mode") == "staged":
        return "none", "staged: the read stage does not hash"
    if opts.get("hash"):
        return opts["hash"], "set"
    note = str((doc.get("notes") or {}).get("verify", ""))
    if "not computed" in note:
        return "none", "its verify note: not computed"
    named = re.search(r"computed \((\w+)\)", note)
    if named:
        return named.group(1), "its verify note"
    return "crc32c", "assumed (the run does not say)"


def read_command(summary: dict, directory: str) -> list[str]:
    """`ckptbench read` over the same files with the read path the run used, cold."""
    cmd = [sys.executable, "-m", "ckptbench", "read", directory, "--json", "--cache", "cold", "--hash",
           summary["hash"]]
    if summary.get("concurrency"):
        cmd += ["--concurrency", str(summary["concurrency"])]
    if summary.get("block_size"):
        cmd += ["--block-size", str(summary["block_size"])]
    if summary.get("read_mode"):
        cmd += ["--read", summary["read_mode"]]
    return cmd


def check_peer(doc: dict, ref: dict, total_size: int) -> list[str]:
    """What is wrong with a peer's state dict against the generator's: checksum, tensor count, bytes."""
    out = []
    if doc.get("checksum") != ref["checksum"]:
        out.append(f"{doc.get('loader')}: checksum of sampled values {doc.get('checksum')} != {ref['checksum']}")
    if doc.get("tensors") != ref["tensors"]:
        out.append(f"{doc.get('loader')}: {doc.get('tensors')} tensors, the checkpoint has {ref['tensors']}")
    if doc.get("bytes") != total_size:
        out.append(f"{doc.get('loader')}: {doc.get('bytes')} tensor bytes, the checkpoint has {total_size}")
    return out


def check_read(doc: dict, crc: dict[str, str], total: int) -> list[str]:
    """What is wrong with a `ckptbench read`: a failed file, fewer bytes than the directory holds, a shard whose
    crc32c is not the generator's (when it hashed crc32c)."""
    out = [f"{doc['files_failed']} file(s) failed"] if doc.get("files_failed") else []
    if doc.get("bytes") != total:
        out.append(f"read {doc.get('bytes')} bytes, the directory holds {total}")
    if doc.get("hash") != "crc32c":
        return out
    got = {os.path.basename(f["path"]): f.get("digest") for f in doc.get("files", [])}
    return out + [f"{n}: crc32c {got.get(n)} != {want}" for n, want in sorted(crc.items()) if got.get(n) != want]
