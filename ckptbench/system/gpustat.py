"""The GPU memory a watched job holds, from nvidia-smi: every NVIDIA driver install ships it, where NVML's Python
bindings would be one more dependency. One query lists every compute process on every GPU with its memory; the
job's share is the sum over its process tree.

Where nvidia-smi is missing or fails, nothing is sampled and `why` says so once; a job in a container whose PIDs
nvidia-smi reports in the host's namespace shows no memory (said in `why` when the GPUs list processes but none
of the job's)."""

from __future__ import annotations

import shutil
import subprocess

QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
TIMEOUT_S = 5.0


class GpuMemory:
    def __init__(self, exe: str | None = None):
        self.exe = exe if exe is not None else shutil.which("nvidia-smi")
        self.why: str | None = None if self.exe else "nvidia-smi not found: the job's GPU memory is not sampled"
        self.others_seen = False

    @property
    def available(self) -> bool:
        return self.exe is not None and self.why is None

    def sample(self, pids: set[int]) -> int | None:
        """Bytes of GPU memory the processes `pids` hold now, over all GPUs; None when it cannot be known."""
        if not self.available:
            return None
        try:
            out = subprocess.run([self.exe, *QUERY], capture_output=True, text=True, timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.why = f"nvidia-smi failed ({type(exc).__name__}): GPU memory no longer sampled"
            return None
        if out.returncode != 0:
            first = (out.stderr.strip().splitlines() or ["no message"])[0][:120]
            self.why = f"nvidia-smi exited {out.returncode} ({first}): GPU memory no longer sampled"
            return None
        total = 0
        for line in out.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit():
                continue  # "[N/A]" memory (MIG without the rights to see it), headers, blank lines
            if int(fields[0]) in pids:
                total += int(fields[1]) << 20  # MiB, as nvidia-smi reports it
            else:
                self.others_seen = True
        return total

    def note(self, peak: int | None) -> str:
        """What the report says about GPU memory: why it is missing, or why it may read zero."""
        if self.why:
            return self.why
        if not peak and self.others_seen:
            return ("the GPUs ran other processes but none of the job's: in a container nvidia-smi may report the "
                    "host's PIDs")
        return ""
