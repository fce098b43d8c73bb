"""A read-only run holds about one block per worker, whatever the file size: mmap windows are dropped from
the page tables once hashed, and the block buffers are reserved but only touched slot by slot."""

from __future__ import annotations

import json

import pytest

# ru_maxrss would not do: the kernel updates the high-water mark at unmap and exit, not when MADV_DONTNEED
# drops pages, so a sampler thread reads the resident size while the engine (GIL released) hashes.
CHILD = r"""
import json, os, sys, threading
import fastio
path, mode = sys.argv[1], sys.argv[2]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
fastio.read_files([path], concurrency=1, read="pread", hash="none")  # resident: the run below maps cached pages
before, peak, done = rss(), [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
sampler = threading.Thread(target=sample)
sampler.start()
# sha256 is slow enough (hundreds of MB/s) for the sampler to see the resident size climb if windows stayed mapped
res = fastio.read_files([path], concurrency=1, read=mode, hash="sha256", block_size=1 << 20, chunk_size=128 << 20)
done.set()
sampler.join()
print(json.dumps({"grew": peak[0] - before, "bytes": res.bytes, "failed": len(res.failed)}))
"""


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_peak_memory_stays_near_one_block_per_worker(files, pyrun, mode):
    size = 96 << 20  # one 96 MiB unit: a window left mapped would show as ~96 MiB of RSS
    path = files.make(size)
    out = pyrun(CHILD, path, mode)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["bytes"] == size and r["failed"] == 0
    assert r["grew"] < 16 << 20, f"{mode}: resident memory grew by {r['grew'] / 2**20:.1f} MiB reading {size >> 20} MiB"
