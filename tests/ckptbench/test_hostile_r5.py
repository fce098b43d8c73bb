"""Hostile checkpoints, fifth round: what earlier rounds left open, each input made by the real library (safetensors,
torch.distributed.checkpoint, torch.save) and then crafted. Bad input is one line naming the file and a non-zero
exit, the same from inspect, run and load."""

from __future__ import annotations

import json
import os
import pickle
import struct

import pytest
import torch
from safetensors.torch import save_file

from ckptbench.checkpoint.formats import FormatError, dcp_format, safetensors_format

HUGE = 1 << 62


def _add_safetensors_entry(path: str, name: str, entry: dict) -> None:
    """A shard safetensors wrote, with one more header entry (padded as safetensors pads)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header[name] = entry
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw[8 + n :])


def _assert_one_line(h, directory: str, match: str) -> None:
    for cmd in ("inspect", "load", "run"):
        extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
        r = h.run_cli(cmd, directory, *extra)
        assert r.rc != 0 and "Traceback" not in r.err and len(r.err_lines) == 1, (cmd, r.err)
        assert match in r.err, (cmd, r.err)


@pytest.mark.parametrize("shape", [[HUGE, HUGE, 0], [0, HUGE, HUGE]])
def test_a_safetensors_empty_tensor_whose_dimensions_overflow_is_one_line(tmp_path, h, shape):
    """A zero-element tensor spans 0 bytes whatever its other dimensions say: [2**62, 2**62, 0] passed every check,
    inspect listed it, and `load` died in torch's view() with a RuntimeError traceback (safetensors refuses it)."""
    directory = tmp_path / "ck"
    directory.mkdir()
    shard = str(directory / "model.safetensors")
    save_file({"w": torch.randn(4, 4)}, shard, metadata={"format": "pt"})
    _add_safetensors_entry(shard, "z", {"dtype": "F32", "shape": shape, "data_offsets": [64, 64]})
    with pytest.raises(FormatError, match="tensor 'z' has shape .* more elements than a tensor can hold"):
        safetensors_format.header_entries(shard)
    _assert_one_line(h, str(directory), "more elements than a tensor can hold")


def test_a_dcp_empty_tensor_whose_dimensions_overflow_is_one_line(tmp_path, h):
    """The same in a DCP's metadata: an entry of size (2**62, 2**62, 0) covered by one empty chunk passed the checks;
    inspect listed it and run blamed the checkpoint's files ('check that its files are whole')."""
    import torch.distributed.checkpoint.metadata as md

    directory, meta = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(4, 4), "e": torch.empty(0, 3)})
    size = torch.Size([HUGE, HUGE, 0])
    entry = meta.state_dict_metadata["e"]
    entry.size = size
    entry.chunks[0].offsets, entry.chunks[0].sizes = torch.Size([0, 0, 0]), size
    old = next(k for k in meta.storage_data if k.fqn == "e")
    meta.storage_data[md.MetadataIndex("e", torch.Size([0, 0, 0]))] = meta.storage_data.pop(old)
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(FormatError, match="entry 'e' has size .* more elements than a tensor can hold"):
        dcp_format.load_dir(directory)
    _assert_one_line(h, directory, "more elements than a tensor can hold")


@pytest.mark.parametrize("which", ["results.csv", "results.csv.jsonl"])
def test_a_row_cut_short_by_a_full_disk_is_taken_back(ckpt, tmp_path, h, monkeypatch, which):
    """A row whose write the disk cut short (half written, then ENOSPC) stayed in results.csv: the run said 'env is
    not a JSON object' instead of 'no space', and every later run, history and compare refused the file ('repair or
    move the file'). What a failed write wrote is taken back; the rows before it stay."""
    import errno

    out = tmp_path / "out"
    out.mkdir()
    results = out / "results.csv"
    first = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    assert first.rc == 0, first.err
    before = {p: p.read_bytes() for p in (results, out / "results.csv.jsonl")}
    write, cut = os.write, []

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}") == str(out / which):
            if not cut:
                cut.append(fd)
                return write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(fd, data)

    monkeypatch.setattr(os, "write", full)
    r = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    monkeypatch.setattr(os, "write", write)
    assert cut, "the write was never cut"
    assert r.rc == 1 and "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    assert "free space" in r.err and str(out / which) in r.err, r.err
    assert (out / which).read_bytes() == before[out / which], "half a record was left"
    assert h.run_cli("history", results).rc == 0
    again = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    assert again.rc == 0, again.err


SECRET = "hunter2XyZ0123456789abcdefghijklmn"  # 34 characters: the length of a Hugging Face token's tail


@pytest.mark.parametrize("text,kept", [
    # a pre-signed URL is a credential until it expires: anyone holding its signature reads the object
    (f"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600&X-Amz-Signature={SECRET}",
     "X-Amz-Expires=3600"),
    (f"https://storage.googleapis.com/b/o?GoogleAccessId=x&Expires=1&Signature={SECRET}&x=1", "&x=1"),
    (f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=rl&sig={SECRET}", "sv=2022-11-02&sp=rl"),
    # tokens whose prefix says what they are, with no name beside them
    (f"python load.py hf_{SECRET} --step 5", "--step 5"),
    (f"pip install git+https://github.com/o/r ghp_{SECRET}xy", "github.com/o/r"),
])
def test_signed_urls_and_prefixed_tokens_vanish(text, kept):
    """A pre-signed S3 (GCS, Azure) URL's signature and a bare Hugging Face or GitHub token were kept whole by redact:
    a job watched with one on its command line had it in the text, --json and results."""
    from ckptbench.core.errors import redact

    out = redact(text)
    assert SECRET not in out and kept in out, out
    assert redact(out) == out


@pytest.mark.parametrize("text", ["--sigma 0.5 --design a --signal-every 10", "/data/assign/hf_small/model.bin"])
def test_words_that_hold_sig_or_hf_are_kept(text):
    from ckptbench.core.errors import redact

    assert redact(text) == text


def test_a_watched_job_with_a_presigned_url_records_no_signature(tmp_path):
    import subprocess
    import sys

    results = tmp_path / "R.csv"
    url = f"https://b.s3.amazonaws.com/ckpt/model.safetensors?X-Amz-Expires=600&X-Amz-Signature={SECRET}"
    job = [sys.executable, "-c", "import time; time.sleep(0.4)", url, f"hf_{SECRET}"]
    p = subprocess.run([sys.executable, "-m", "ckptbench", "watch", "--json", "--no-verdict", "--interval", "0.1",
                        "--results", str(results), "--", *job], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    recorded = results.read_text() + open(f"{results}.jsonl").read()
    for text in (p.stdout, p.stderr, recorded):
        assert SECRET not in text, text
    assert "b.s3.amazonaws.com/ckpt/model.safetensors" in recorded


_MAPPER = """
import mmap, os, sys, time
held = []
for n in os.listdir(sys.argv[1]):
    f = open(os.path.join(sys.argv[1], n), "rb")
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    m[:]
    held.append((f, m))
print("mapped", flush=True)
time.sleep(60)
"""


def test_watch_finds_mapped_shards_whose_names_hold_line_breaks(tmp_path):
    """/proc/PID/maps writes a newline in a name as \\012, and splitlines() also broke a line at \\r, \\x1c-\\x1e and
    \\x85: a job mapping 'a\\rb.safetensors' or 'c\\nd.safetensors' was seen mapping nothing of them (a file whose
    name holds a literal backslash-012 is told apart by its device and inode)."""
    import subprocess
    import sys

    from ckptbench.watch.maps import FileJudge, MapReader

    ck = tmp_path / "ck"
    ck.mkdir()
    names = ["plain.safetensors", "a\rb.safetensors", "c\nd.safetensors", "e\x85f.safetensors", "g\\012h.safetensors",
             "i\x1cj.safetensors"]
    for i, n in enumerate(names):
        (ck / n).write_bytes(bytes([i + 1]) * (4096 * (i + 1)))
    job = subprocess.Popen([sys.executable, "-c", _MAPPER, str(ck)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "mapped"
        for judge in (FileJudge(str(ck)), FileJudge()):  # placed under --source, or by its name alone
            files, resident = MapReader(judge).sample([job.pid])
            assert files == {str(ck / n): 4096 * (i + 1) for i, n in enumerate(names)}
            assert resident == {(job.pid, str(ck / n)): 4096 * (i + 1) for i, n in enumerate(names)}
    finally:
        job.kill()
        job.wait()


@pytest.mark.parametrize("run_id", [[1, 2], {"a": 1}, []])
def test_history_of_a_document_whose_run_id_is_not_text_is_no_traceback(ckpt, tmp_path, h, run_id):
    """A run document edited by hand (or by another user) to give its run_id as a list or an object: compare passed it
    over, history indexed its documents by it and died with 'unhashable type' (a traceback)."""
    results = tmp_path / "r.csv"
    assert h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results).rc == 0
    docs = [json.loads(line) for line in open(f"{results}.jsonl")]
    for d in docs:
        if d["record"] == "run":
            d["run_id"] = run_id
    with open(f"{results}.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    for args in ((), ("--json",)):
        r = h.run_cli("history", results, *args)
        assert r.rc == 0 and "Traceback" not in r.err, r.err


def test_a_folder_of_fifos_only_is_not_called_empty(tmp_path, h):
    """A folder holding only FIFOs (a shard and `latest` made FIFOs) was 'empty: the directory holds no files': the
    entries that are never read were passed over in silence, which hostile-input.md says never happens."""
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / "model.safetensors")
    os.mkfifo(ck / "latest")
    more = {"run": ("--results", ""), "pack": (tmp_path / "out",), "upload": ("s3://bucket/prefix",)}
    for cmd in ("inspect", "run", "read", "verify", "pack", "upload"):
        r = h.run_cli(cmd, ck, *more.get(cmd, ()))
        assert r.rc == 2 and "Traceback" not in r.err and len(r.err_lines) == 1, (cmd, r.err)
        assert "empty" not in r.err and "2 entries" in r.err and "a FIFO" in r.err, (cmd, r.err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", [
    f"GITHUB_PAT={SECRET}", f"PRIVATE_KEY={SECRET}", f"--private-key {SECRET}", f"github_pat_{SECRET}_{SECRET}",
    f"glpat-{SECRET}", f"xoxb-{SECRET}", f"python -c \"key='sk-proj-{SECRET}A1'\"", f"sk-ant-api03-{SECRET}Z9"])
def test_more_credential_shapes_vanish(text):
    """Left whole by the first pass: a PAT or a private key named so, GitHub's fine-grained, GitLab's and Slack's
    tokens, and OpenAI's or Anthropic's keys with no name beside them."""
    from ckptbench.core.errors import redact

    assert SECRET not in redact(text), redact(text)


@pytest.mark.parametrize("text", ["--compat-mode x", "/data/path/to/ck", "/data/sk-model-checkpoint-2024-01-01-final",
                                  "--patience 3", "spatial=2"])
def test_words_near_the_new_shapes_are_kept(text):
    from ckptbench.core.errors import redact

    assert redact(text) == text
