"""The checklist's items on the path to storage: the network between this box and the checkpoint's bytes, and the
mount's options (a FUSE mount's judged with fuse.py's knowledge of its daemon)."""

from __future__ import annotations

from ckptbench.checklist import fuse as checklist_fuse
from ckptbench.checklist.facts import Facts, reason, unknown
from ckptbench.core.verdicts import Verdict
from ckptbench.system import probes

NFS_MIN_RW = 1 << 20


def network_path(f: Facts) -> Verdict:
    why = "a restore over the network is bounded by the path: a global or proxied endpoint, a congested link, retransmits"
    title = "Network path"
    if f.scheme == "s3":
        s3 = f.s3 or {}
        ev = dict(s3)
        if s3.get("proxies"):
            return Verdict("network_path", title, "warn", ev, why,
                        "route S3 traffic around the proxy: NO_PROXY=.amazonaws.com, or a VPC gateway endpoint")
        if not s3.get("regional"):
            return Verdict("network_path", title, "warn", ev, why,
                           "set AWS_REGION so the client uses the regional endpoint")
        return Verdict("network_path", title, "ok", ev, why, "none")
    if unknown(f.mount):
        return Verdict("network_path", title, "unknown", {"reason": reason(f.mount)}, why,
                       "find the mount with `findmnt -T SOURCE`")
    m = f.mount
    ev = {"fs_type": m.fs_type, "mount_source": m.source}
    if m.fs_type.startswith("fuse"):
        kind, endpoint = checklist_fuse.endpoint(f)
        ev |= {"daemon": kind, "endpoint": endpoint}
        where = f"{kind} reads from {endpoint}" if endpoint else f"the {kind or 'FUSE'} daemon hides its backend"
        return Verdict("network_path", title, "unknown", ev, why,
                       f"{where}: check that it is the regional (or VPC) endpoint of the bucket's region and that no "
                    "proxy sits in between; for S3, compare with `ckptbench check s3://BUCKET/PREFIX`")
    if not (m.fs_type.startswith("nfs") or m.fs_type in ("lustre", "cifs", "smb3", "ceph", "glusterfs")):
        return Verdict("network_path", title, "ok", ev | {"network": False}, why,
                       "none: local storage, no network path")
    ev["server"] = probes.nfs_server(m) or m.source.split(":", 1)[0]
    if unknown(f.retransmit_rate):
        return Verdict("network_path", title, "unknown", ev | {"reason": reason(f.retransmit_rate)}, why,
                       "check retransmits with `nstat -az TcpRetransSegs` while a restore runs")
    ev["tcp_retransmit_pct"] = round(f.retransmit_rate * 100, 3)
    if f.retransmit_rate > 0.01:
        return Verdict("network_path", title, "warn", ev, why,
                       "retransmits above 1 %: check the link (ethtool -S, MTU), or move the mount to the server's subnet")
    return Verdict("network_path", title, "ok", ev, why, "none")


def mount_options(f: Facts) -> Verdict:
    why = "small rsize/wsize, soft mounts, atime updates and short read-ahead each cut sequential read throughput"
    title = "Mount options"
    if f.scheme == "s3":
        return Verdict("mount_options", title, "ok", {"scheme": "s3"}, why, "none: no mount")
    if unknown(f.mount):
        return Verdict("mount_options", title, "unknown", {"reason": reason(f.mount)}, why,
                       "check `findmnt -T SOURCE`")
    m = f.mount
    opts = probes.mount_options(m)
    ev = {"fs_type": m.fs_type, "options": probes.options_once(m.options), "preset": f.preset.name if f.preset else None}
    if not unknown(f.read_ahead_kb):
        ev["read_ahead_kb"] = f.read_ahead_kb
    problems, fixes = [], []
    severe = False
    if m.fs_type.startswith("fuse"):
        unjudged = checklist_fuse.option_problems(f, ev, problems, fixes)
        if unjudged:
            return Verdict("mount_options", title, "unknown", ev, why, unjudged)
    if m.fs_type.startswith("nfs"):
        for key in ("rsize", "wsize"):
            v = int(opts.get(key, 0) or 0)
            ev[key] = v
            if v < NFS_MIN_RW:
                problems.append(f"{key}={v} < 1 MiB")
                severe |= v < 256 << 10
        if "soft" in opts:
            problems.append("soft mount: I/O errors instead of retries on a server hiccup")
            severe = True
        if "noresvport" not in opts:
            problems.append("no noresvport: reconnects after a network event can hang")
        if int(opts.get("nconnect", 1) or 1) < 2:
            problems.append("one TCP connection (no nconnect)")
        want = f.preset.mount_options if f.preset else {}
        fixes.append("mount -t nfs4 -o " + ",".join(
            (k if v is True else f"{k}={v}") for k, v in (want or {"rsize": NFS_MIN_RW, "wsize": NFS_MIN_RW, "hard": True,
                                                                   "noresvport": True, "nconnect": 16}).items()))
    if "strictatime" in opts:
        problems.append("strictatime: every read writes an access time")
        fixes.append("remount with noatime")
    elif "noatime" not in opts and "relatime" not in opts and m.fs_type not in ("tmpfs", "proc", "sysfs"):
        problems.append("atime updates on (no noatime/relatime)")
        fixes.append("remount with noatime")
    if not unknown(f.read_ahead_kb) and f.read_ahead_kb < 128 and not m.fs_type.startswith("nfs"):
        problems.append(f"read_ahead_kb={f.read_ahead_kb} is small for multi-GB shards")
        fixes.append("echo 4096 > /sys/block/DEV/queue/read_ahead_kb (or blockdev --setra 8192 /dev/DEV)")
    if m.fs_type == "lustre" and isinstance(f.stripe, dict) and f.preset and f.preset.min_stripe_count:
        ev["stripe"] = f.stripe
        if 0 < f.stripe["stripe_count"] < f.preset.min_stripe_count:
            problems.append(f"stripe count {f.stripe['stripe_count']} for the largest shard")
            fixes.append(f"lfs setstripe -c {f.preset.min_stripe_count} (or -1) on the checkpoint directory before saving")
    ev["problems"] = problems
    if not problems:
        return Verdict("mount_options", title, "ok", ev, why, "none")
    return Verdict("mount_options", title, "fail" if severe else "warn", ev, why, "; ".join(fixes))
