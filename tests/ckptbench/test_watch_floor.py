"""`ckptbench watch` on a loader that maps its checkpoint (safetensors): the mapped file is named and judged without
--source, only checkpoint files are listed (never a mapped or open library, database or data set: a name says
checkpoint, a size does not), and the watch document holds the loader against
this box's floor: none and a note saying how to measure it when nothing is cached, real figures once
`ckptbench floor` has measured it."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import fastio
from ckptbench.core.units import human_pct
from ckptbench.system.floorcache import OVER_FLOOR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOOR_KEYS = ("floor_s", "efficiency", "binding", "binding_gbps", "floor_times_s", "floor_note")

MAPPING_LOADER = """
    import sys
    from safetensors.torch import load_file
    from ckptbench.mark import stage
    import time
    time.sleep(0.3)  # imports done: the interval the mark falls in reads nothing else
    stage("load")
    sd = {k: v.clone() for k, v in load_file(sys.argv[1]).items()}  # every byte touched through the mapping
    stage("done")
    print(len(sd))
"""


def _run(*args, cache: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "XDG_CACHE_HOME": cache})


def _watch(job: str, ckpt: str, cache: str, *extra) -> dict:
    fastio.evict([ckpt])
    r = _run("watch", "--json", "--interval", "0.05", *extra, "--", sys.executable, job, ckpt, cache=cache)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 64 MiB safetensors checkpoint alone in its directory (what `ckptbench floor` reads), and the loader."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("mapped")
    ckpt = d / "ckpt" / "model.safetensors"
    ckpt.parent.mkdir()
    save_file({f"w{i}": torch.randn(1 << 20) for i in range(16)}, str(ckpt))
    job = d / "load.py"
    job.write_text(textwrap.dedent(MAPPING_LOADER))
    return str(ckpt), str(job)


def test_a_mapped_checkpoint_is_named_and_judged_without_source(tmp_path, checkpoint):
    ckpt, job = checkpoint
    doc = _watch(job, ckpt, str(tmp_path / "cache"))
    size = os.path.getsize(ckpt)
    assert doc["files"] == {ckpt: size}  # the interpreter, libpython and the extensions it maps are not listed
    assert doc["mapped"] == [ckpt]
    assert abs(doc["bytes"] - size) <= 0.1 * size, (doc["bytes"], size)  # cold: the faults came from the disk
    assert doc["storage"]["files"] == 1 and doc["storage"]["gbps"] > 0  # the verdict read the mapped file itself
    v = doc["verdict"]
    assert v["kind"] != "unknown" and "none seen open" not in doc["storage"]["cache"], v
    assert doc["hot"] is False
    # no floor cached in this cache directory: none, and the note says how to measure it for these files
    assert all(k in doc for k in FLOOR_KEYS)
    assert doc["floor_s"] is None and doc["efficiency"] is None and doc["binding"] is None
    assert f"ckptbench floor {os.path.dirname(ckpt)}" in doc["floor_note"]
    assert "of this box's floor" not in v["summary"]


def test_the_watch_holds_the_loader_against_a_measured_floor(tmp_path, checkpoint):
    ckpt, job = checkpoint
    cache = str(tmp_path / "cache")
    r = _run("floor", os.path.dirname(ckpt), cache=cache)
    assert r.returncode == 0, r.stderr
    results = tmp_path / "results.csv"
    doc = _watch(job, ckpt, cache, "--results", results)
    assert doc["floor_s"] > 0 and doc["binding"] in doc["floor_times_s"]
    assert "storage" in doc["floor_times_s"]  # a cold read of 64 MiB or more: the mount's storage figure is used
    assert doc["floor_s"] == max(doc["floor_times_s"].values())
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / doc["io_span_s"], rel=1e-9)
    assert doc["binding_gbps"] > 0
    want = (f"your loader runs at {human_pct(doc['efficiency'])} of this box's floor (floor {doc['floor_s']:.3f} s, "
            f"bound by {doc['binding']} ({doc['binding_gbps']:.2f} GB/s {doc['binding_how']}))")
    summary = doc["verdict"]["summary"]
    assert summary.startswith(want) and summary[len(want)] in ";:", summary
    if doc["efficiency"] > OVER_FLOOR:  # past a good ceiling's spread the floor was measured low (a busy box)
        assert "so that floor is unreliable" in summary, summary  # and the verdict is the loader's own evidence
    elif doc["efficiency"] >= 0.9:  # at the storage's floor: the storage binds, whatever the re-read says
        assert doc["verdict"]["verdict"] == "storage-bound", summary
    assert doc["verdict"]["evidence"]["floor_s"] == doc["floor_s"]
    from ckptbench.records.results import read_documents

    recorded = read_documents(str(results), "run")[0]  # the record beside ckptbench's runs carries them too
    assert {k: recorded[k] for k in FLOOR_KEYS} == {k: doc[k] for k in FLOOR_KEYS}
    r = _run("watch", "--interval", "0.05", "--", sys.executable, job, ckpt, cache=cache)  # the text a user reads
    assert r.returncode == 0, r.stderr
    assert f"mapped: {ckpt}" in r.stdout and "of this box's floor" in r.stdout and "floor: " in r.stdout
    assert "this evicts them from the page cache; --no-verdict skips it" in r.stderr  # it changes the box: said


def test_a_mapped_library_is_never_listed_and_a_mapped_checkpoint_is(tmp_path):
    """Copies of fastio's extension (a large ELF file outside the library trees) loaded under a checkpoint's name
    and under its own, beside a plain file mapped read-only: only the plain file is a checkpoint."""
    engine = next(os.path.join(REPO, "fastio", n) for n in os.listdir(os.path.join(REPO, "fastio"))
                  if n.endswith(".so"))
    for name in ("weights.bin", "libcopy.so"):
        shutil.copy(engine, tmp_path / name)
    data = tmp_path / "data.pt"
    data.write_bytes(os.urandom(2 << 20))
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import ctypes, mmap, sys, time
        libs = [ctypes.CDLL(p) for p in sys.argv[1:3]]
        with open(sys.argv[3], "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        total = sum(m[i] for i in range(0, len(m), 4096))
        time.sleep(0.5)  # mapped, its descriptor closed: only /proc/PID/maps shows it
    """))
    r = _run("watch", "--json", "--no-verdict", "--interval", "0.05", "--", sys.executable, job,
             tmp_path / "weights.bin", tmp_path / "libcopy.so", data, cache=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["files"] == {str(data): 2 << 20} and doc["mapped"] == [str(data)]
    assert doc["bytes"] >= 2 << 20  # the touched pages, read through the mapping


def test_the_map_reader_sees_a_mapping_and_the_pages_it_touched(tmp_path):
    from ckptbench.watch.maps import MapReader

    path = tmp_path / "shard.safetensors"
    path.write_bytes(os.urandom(8 << 20))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        reader = MapReader()
        files, resident = reader.sample([os.getpid()])
        assert files == {str(path): 8 << 20} and resident.get((os.getpid(), str(path)), 0) <= 1 << 20
        sum(m[i] for i in range(0, 4 << 20, mmap.PAGESIZE))  # half the file, a byte a page
        _, resident = reader.sample([os.getpid()])
        assert 4 << 20 <= resident[(os.getpid(), str(path))] <= 5 << 20  # fault-around maps a few pages more
    finally:
        m.close()
    assert reader.sample([os.getpid()]) == ({}, {})


def test_code_mapped_read_only_under_a_checkpoint_name_is_not_a_checkpoint(tmp_path):
    """An ELF file mapped without execute permission (its name says checkpoint, its magic says code)."""
    from ckptbench.watch.maps import MapReader

    engine = next(os.path.join(REPO, "fastio", n) for n in os.listdir(os.path.join(REPO, "fastio"))
                  if n.endswith(".so"))
    code = tmp_path / "code.ckpt"
    shutil.copy(engine, code)
    assert os.path.getsize(code) >= 1 << 20
    with open(code, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        assert m[:4] == b"\x7fELF" and MapReader().sample([os.getpid()]) == ({}, {})
    finally:
        m.close()


def test_a_mapping_of_a_file_deleted_or_replaced_since_is_not_a_checkpoint(tmp_path):
    from ckptbench.watch.maps import MapReader

    gone, replaced = tmp_path / "gone.safetensors", tmp_path / "replaced.safetensors"
    maps = []
    for p in (gone, replaced):
        p.write_bytes(os.urandom(1 << 20))
        with open(p, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    gone.unlink()
    replaced.unlink()
    replaced.write_bytes(os.urandom(1 << 20))  # the same name, another inode: not the file the mapping reads
    try:
        assert MapReader().sample([os.getpid()]) == ({}, {})
    finally:
        for m in maps:
            m.close()


def test_bytes_through_mappings_add_to_read_calls_and_the_disk_is_not_counted_twice():
    from ckptbench.watch import sampler as watch

    iv = watch.Interval(0.0, 1.0, 10 << 20, 50 << 20, 1.0, 1.0, 1, 0.0, 1 << 30, "reading", mapped_bytes=40 << 20)
    assert watch.window_bytes([iv], 0.0, 1.0) == 50 << 20  # read calls + mapped equal what the disk gave
    iv = watch.Interval(0.0, 1.0, 10 << 20, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "reading", mapped_bytes=40 << 20)
    assert watch.window_bytes([iv], 0.0, 1.0) == 50 << 20 and iv.gbps == pytest.approx(50 * 2 ** 20 / 1e9)


def test_the_disks_count_beyond_the_checkpoints_size_is_not_the_checkpoints():
    """The disk's count is the process's, of every file: libraries faulted in from a cold cache as the load ran
    counted as checkpoint bytes. Where the checkpoint's files are known it counts up to their size; the read calls
    and mappings, which are the checkpoint's, still count whole."""
    from ckptbench.watch import sampler as watch

    iv = watch.Interval(0.0, 1.0, 10 << 20, 254 << 20, 1.0, 1.0, 1, 0.0, 1 << 30, "reading", mapped_bytes=40 << 20)
    assert watch.window_bytes([iv], 0.0, 1.0) == 254 << 20  # no files known: the disk's count is all there is
    assert watch.window_bytes([iv], 0.0, 1.0, disk_cap=128 << 20) == 128 << 20
    assert watch.window_bytes([iv], 0.0, 1.0, disk_cap=32 << 20) == 50 << 20  # never under what the job's calls saw


def test_the_floor_sentence_leads_the_verdict_and_a_missing_floor_says_nothing():
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    reading = watch.Interval(0.0, 1.0, 100 << 20, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "reading")
    report = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=100 << 20, disk_bytes=0, files={},
                               intervals=[reading], phases=[])
    probe = verdict.StorageProbe(2.0, "cold (verified)", 1, 100 << 20)
    floor = {"floor_s": 1.71, "efficiency": 0.31, "binding": "storage", "binding_gbps": 2.1}
    v = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=floor)
    assert v.verdict == "loader-cpu-bound" and v.why.startswith(
        "your loader runs at 31 % of this box's floor (floor 1.710 s, bound by storage (2.10 GB/s)); the loader got")
    assert v.evidence["efficiency"] == 0.31
    bare = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=dict(floor, floor_s=None, efficiency=None))
    assert bare.why == verdict.judge(report, probe, cpus=2, mem_total=64 << 30).why
    # at the floor, and the floor is the device's: the storage binds, whatever the faster re-read said (a new user
    # saw "runs at 112 % of this box's floor" and "loader-cpu-bound" in one verdict)
    at = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=dict(floor, efficiency=1.0))
    assert at.verdict == "storage-bound" and "the storage sets this restore's time, not the loader" in at.why
    assert at.fix == verdict.STORAGE_FIX
    # over 105 % the floor is the one that is wrong (a ceiling measured low): the loader's own diagnosis stands
    # (new-user trial 15: "255 %" made a one-thread loader storage-bound); was 1.12 -> storage-bound above
    over = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=dict(floor, efficiency=1.12))
    assert over.verdict == "loader-cpu-bound" and "that floor is unreliable" in over.why
    memory = verdict.judge(report, probe, cpus=2, mem_total=64 << 30,
                           floor=dict(floor, efficiency=0.95, binding="fresh memory"))
    assert memory.verdict == "loader-cpu-bound"  # no box kind for fresh memory: the loader's evidence stands


HOSTILE_MAP = """
    import mmap, sys, time
    import torch  # safe_open(..., "pt") imports it on first use: inside the window its modules would be read
    from safetensors import safe_open
    from ckptbench.mark import stage
    ckpt, mapped, held = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    time.sleep(0.3)  # imports done: the interval the mark falls in reads nothing else
    stage("load")
    maps = []
    for p in mapped:  # mapped and touched, the descriptor closed: only /proc/PID/maps shows them
        with open(p, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
        sum(maps[-1][i] for i in range(0, len(maps[-1]), mmap.PAGESIZE))
    fds = [open(p, "rb") for p in held]  # open, never read: only /proc/PID/fd shows them
    with safe_open(ckpt, "pt") as f:
        sd = {k: f.get_tensor(k).clone() for k in f.keys()}  # every byte touched through its mapping
        time.sleep(0.5)  # everything held at once for several samples
    stage("done")
    print(len(sd))
"""


def _libc() -> str:
    with open("/proc/self/maps") as f:
        return next(line.split()[-1] for line in f if "/libc.so" in line or "/libc-" in line)


def test_only_files_that_look_like_a_checkpoint_are_listed_and_counted(tmp_path):
    """A job that maps a database, a sqlite index, a datasets .arrow, an .npy memmap and a non-ELF `.so`, and holds
    open a copy of libc named weights.bin, a copy of ls named exe.ckpt and the `.so`, beside the safetensors
    checkpoint it loads: only the checkpoint is listed, and only its bytes count (the mapped others are 14 MiB)."""
    from safetensors.torch import save_file

    ckpt = tmp_path / "model.safetensors"
    save_file({f"w{i}": torch.randn(1 << 20) for i in range(4)}, str(ckpt))  # 16 MiB
    mapped = {"cache.db": 5 << 20, "index.sqlite": 3 << 20, "train.arrow": 2 << 20, "train.npy": 2 << 20,
              "model.safetensors.so": 2 << 20}
    for name, size in mapped.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    shutil.copy(_libc(), tmp_path / "weights.bin")
    shutil.copy(shutil.which("ls"), tmp_path / "exe.ckpt")
    held = [tmp_path / "weights.bin", tmp_path / "exe.ckpt", tmp_path / "model.safetensors.so"]
    job = tmp_path / "hostile_map.py"
    job.write_text(textwrap.dedent(HOSTILE_MAP))
    r = _run("watch", "--json", "--no-verdict", "--interval", "0.05", "--", sys.executable, job, ckpt,
             ",".join(str(tmp_path / n) for n in mapped), ",".join(map(str, held)), cache=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    size = os.path.getsize(ckpt)
    assert doc["files"] == {str(ckpt): size} and doc["mapped"] == [str(ckpt)]
    assert 0.9 * size <= doc["bytes"] <= size + (2 << 20), (doc["bytes"], size)


def test_a_name_says_checkpoint_its_size_does_not():
    from ckptbench.watch.maps import is_checkpoint_file

    for path in ("/d/model.safetensors", "/d/pytorch_model-00001-of-00002.bin", "/d/__0_0.distcp", "/d/.metadata",
                 "/d/global_step5/mp_rank_00_model_states.pt", "/d/last.ckpt", "/d/rng_state.pth", "/d/m.gguf"):
        assert is_checkpoint_file(path, 1), path
    for path in ("/d/cache.db", "/d/index.sqlite", "/d/train.arrow", "/d/x.npy", "/d/x.parquet", "/d/big.raw",
                 "/d/model.safetensors.so", "/d/libx.so.1.2", "/v/lib/python3.12/site-packages/torch/x.pt"):
        assert not is_checkpoint_file(path, 1 << 40), path
    assert is_checkpoint_file("/src/part.raw", source="/src") and is_checkpoint_file("/src/cache.db", source="/src")
    assert not is_checkpoint_file("/srcx/part.raw", source="/src") and not is_checkpoint_file("/src/l.so", source="/src")


def test_under_the_named_source_any_file_is_the_checkpoints_but_never_code(tmp_path):
    """Watch(source=...) through a symbolic link to the checkpoint's folder: a shard with no checkpoint name under
    it is listed, open or mapped; code under it and a database beside it are not."""
    from ckptbench.watch import sampler as watch

    src = tmp_path / "ckpt"
    src.mkdir()
    (tmp_path / "link").symlink_to(src)
    for name in ("part.raw", "part.map"):
        (src / name).write_bytes(os.urandom(1 << 20))
    shutil.copy(shutil.which("ls"), src / "tool.bin")
    (tmp_path / "cache.db").write_bytes(os.urandom(1 << 20))
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import mmap, sys, time
        held = [open(p, "rb") for p in sys.argv[1:4]]
        with open(sys.argv[4], "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        time.sleep(0.6)
    """))
    proc = subprocess.Popen([sys.executable, str(job), str(src / "part.raw"), str(src / "tool.bin"),
                             str(tmp_path / "cache.db"), str(src / "part.map")])
    report = watch.Watch(proc.pid, interval=0.05, proc=proc, source=str(tmp_path / "link")).run()
    assert report.exit_code == 0
    assert report.files == {str(src / "part.raw"): 1 << 20, str(src / "part.map"): 1 << 20}
    assert report.mapped == [str(src / "part.map")]


def test_watch_source_names_the_checkpoints_files_whatever_their_names(tmp_path):
    """`watch --source DIR`: a shard with no checkpoint extension, read by the job, is the checkpoint's; a database
    beside the folder is not."""
    src = tmp_path / "ck"
    src.mkdir()
    (src / "shard.raw").write_bytes(os.urandom(4 << 20))
    (src / "model.safetensors").write_bytes(b"{}")  # the source must be a checkpoint folder to open
    (tmp_path / "cache.db").write_bytes(os.urandom(4 << 20))
    job = tmp_path / "job.py"
    job.write_text("import sys, time\nfor p in sys.argv[1:]:\n    with open(p, 'rb') as f:\n"
                   "        while f.read(1 << 16):\n            time.sleep(0.002)\n")
    r = _run("watch", "--json", "--no-verdict", "--interval", "0.05", "--source", src, "--", sys.executable, job,
             src / "shard.raw", tmp_path / "cache.db", cache=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert str(src / "shard.raw") in files and str(tmp_path / "cache.db") not in files, files


def test_a_hot_mapped_load_the_watch_saw_part_of_gets_no_efficiency(tmp_path, plant_floor):
    """A loader mapping its files from the page cache maps, reads and unmaps a shard between two samples: the watch
    sees part of its bytes and part of its window, and a new user's hot load read 'at 11 % of this box's floor'."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    shards = []
    for i in range(4):
        p = tmp_path / f"model-{i}.safetensors"
        p.write_bytes(b"\0" * (8 << 20))
        shards.append(str(p))
    plant_floor(8.0, tmp_path, storage_gbps=2.0)
    reading = watch.Interval(0.0, 0.25, 0, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "faulting", mapped_bytes=6 << 20)

    def report(nbytes: int, disk: int = 0) -> watch.WatchReport:
        return watch.WatchReport(pid=1, command="job", wall_s=2.0, bytes=nbytes, disk_bytes=disk,
                                 files={p: 8 << 20 for p in shards[:2]}, intervals=[reading], phases=[],
                                 mapped=shards[:2], residency_first={p: 1.0 for p in shards[:2]})

    part = verdict.floor_fields(report(6 << 20), shards)  # 6 of 32 MiB seen
    assert part["efficiency"] is None and part["floor_s"] is None
    assert part["floor_note"].startswith("no efficiency: the job maps its files from the page cache faster than")
    # the two it mapped, not --source's four; in the headline's unit (it read '0.01 of the files' 0.02 GB' under 'read
    # at least 6.0 MiB')
    assert "it counted 6.0 MiB of the files' 16.0 MiB" in part["floor_note"]
    whole = verdict.floor_fields(report(31 << 20), shards)  # all but a little: judged
    assert whole["efficiency"] is not None and whole["floor_s"] > 0
    # cold, the disk's counter is a lower bound as well (a cold safetensors load of 1008 MiB counted 576 MiB of it
    # and read "at 37 % of this box's floor"): under 90 % of the files is no efficiency, whatever counted it
    cold = verdict.floor_fields(report(6 << 20, disk=6 << 20), shards)
    assert cold["efficiency"] is None and cold["floor_s"] is None
    assert cold["floor_note"].startswith("no efficiency: the job's bytes are undercounted (it counted 6.0 MiB of")


@pytest.mark.parametrize("names, says, never", [
    (["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], "a thread per shard",
     "safetensors instead of pickle"),
    (["pytorch_model.bin"], "safetensors instead of pickle", "a thread per shard"),
    (["shard.dat"], "one thread or process per shard", "pickle"),
])
def test_a_one_thread_loader_is_told_the_fix_for_what_it_reads(names, says, never):
    """A new user loading safetensors one shard at a time was told to use safetensors instead of pickle."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    reading = watch.Interval(0.0, 1.0, 100 << 20, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "reading")
    report = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=100 << 20, disk_bytes=0,
                               files={f"/ck/{n}": 50 << 20 for n in names}, intervals=[reading], phases=[])
    v = verdict.judge(report, verdict.StorageProbe(2.0, "cold (verified)", 1, 100 << 20), cpus=2, mem_total=64 << 30)
    assert v.verdict == "loader-cpu-bound" and says in v.fix and never not in v.fix, v.fix
