"""The watched job's GPU memory from nvidia-smi, and the "copying-to-gpu" phase it shows. This box has no GPU:
nvidia-smi is stood in for by a script that prints what the real one prints for
`--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`, read from a file the test (or the job)
writes. What runs on a real GPU box is the same parsing and the same phase rule."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ckptbench.watch import phases
from ckptbench.watch import sampler as watch
from ckptbench.system.gpustat import GpuMemory


@pytest.fixture
def fake_smi(tmp_path):
    """(path of a stand-in nvidia-smi, the file whose lines it prints)."""
    table = tmp_path / "apps.csv"
    table.write_text("")
    exe = tmp_path / "nvidia-smi"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        assert sys.argv[1:] == ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], sys.argv
        sys.stdout.write(open({str(table)!r}).read())
    """))
    exe.chmod(0o755)
    return str(exe), table


def test_the_jobs_processes_memory_is_summed_and_nothing_else(fake_smi):
    exe, table = fake_smi
    table.write_text("100, 2048\n101, 512\n999, 40000\n102, [N/A]\n\n")
    gpu = GpuMemory(exe)
    assert gpu.sample({100, 101, 102}) == (2048 + 512) << 20
    assert gpu.others_seen and gpu.note(1) == ""


def test_a_job_on_no_gpu_while_others_are_says_why_it_may_read_zero(fake_smi):
    exe, table = fake_smi
    table.write_text("999, 40000\n")
    gpu = GpuMemory(exe)
    assert gpu.sample({5}) == 0
    assert "host's PIDs" in gpu.note(0)


def test_without_nvidia_smi_or_when_it_fails_nothing_is_sampled_and_the_note_says_why(tmp_path):
    assert GpuMemory("").sample({1}) is None  # what shutil.which gives on a box without it
    assert "nvidia-smi not found" in GpuMemory("").why
    bad = tmp_path / "nvidia-smi"
    bad.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    bad.chmod(0o755)
    gpu = GpuMemory(str(bad))
    assert gpu.sample({1}) is None and not gpu.available
    assert gpu.why.startswith("nvidia-smi exited 9 (NVIDIA-SMI has failed")


def test_memory_growing_fast_with_little_io_is_copying_to_the_gpu():
    quiet = watch.Interval(0.0, 0.5, 0, 0, 0.1, 0.1, 0, 0.0, 1 << 30, "waiting")
    copying = phases.with_gpu(quiet, 1 << 30, 3 << 30, 0.5)  # 2 GiB in 0.5 s
    assert copying.phase == "copying-to-gpu" and copying.gpu_bytes == 3 << 30
    assert phases.with_gpu(quiet, 1 << 30, (1 << 30) + (1 << 20), 0.5).phase == "waiting"  # 2 MB/s: not copying
    reading = watch.Interval(0.0, 0.5, 1 << 30, 0, 0.1, 0.1, 0, 0.0, 1 << 30, "reading")
    assert phases.with_gpu(reading, 0, 2 << 30, 0.5).phase == "reading"  # I/O in flight says more


JOB = """
    import os, sys, time
    table = sys.argv[1]
    time.sleep(0.6)
    for mib in range(0, 4001, 500):  # a device stage: 4000 MiB land on the GPU over about 1.6 s, no reads
        with open(table + ".tmp", "w") as f:
            f.write(f"{os.getpid()}, {mib}\\n777, 100\\n")
        os.replace(table + ".tmp", table)
        time.sleep(0.2)
    time.sleep(0.6)
"""


def test_a_watched_job_copying_to_the_gpu_shows_the_phase_and_its_peak(fake_smi, tmp_path):
    exe, table = fake_smi
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    proc = subprocess.Popen([sys.executable, str(script), str(table)])
    try:
        report = watch.Watch(proc.pid, interval=0.1, proc=proc, gpu=GpuMemory(exe)).run()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert report.gpu_peak_bytes == 4000 << 20 and report.gpu_note == ""
    assert "copying-to-gpu" in [p["phase"] for p in report.phases]
    copying = [i for i in report.intervals if i.phase == "copying-to-gpu"]
    assert all(i.gpu_bytes and i.gpu_bytes > 0 for i in copying)
    doc = report.to_json()
    assert doc["gpu_peak_bytes"] == 4000 << 20


def test_the_watch_text_says_the_gpu_memory_or_why_not(fake_smi, tmp_path):
    exe, table = fake_smi
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    env = dict(os.environ, PATH=os.path.dirname(exe) + os.pathsep + os.environ["PATH"])
    out = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--no-verdict", "--results", "", "--",
                          sys.executable, str(script), str(table)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GPU memory (nvidia-smi): peak 3.9 GiB" in out.stdout
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--no-verdict", "--results", "", "--",
                          sys.executable, "-c", "import time; time.sleep(0.5)"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GPU memory: nvidia-smi not found" in out.stdout
