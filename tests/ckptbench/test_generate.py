"""`ckptbench gen`: layout, manifest, round trip through `load`, determinism, and bad input that writes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

import pytest

COMBOS = [(fmt, ranks) for fmt in ("safetensors", "torch", "dcp") for ranks in (1, 4)]
SMALL_ALWAYS = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "generation_config.json", "scheduler.json"]


@pytest.mark.parametrize("fmt, ranks", COMBOS)
def test_manifest_lists_every_file_with_size_and_crc32c(h, ckpt, fmt, ranks):
    root = ckpt(fmt, ranks)
    files = h.files_under(root)
    doc = h.read_manifest(root)
    assert doc["format"] == fmt and doc["world_size"] == ranks and doc["hash"] == "crc32c" and doc["seed"] == 0
    listed = [e["path"] for e in doc["files"]]
    assert len(listed) == len(set(listed))
    assert set(listed) == set(files) - {h.MANIFEST}
    for e in doc["files"]:
        data = files[e["path"]]
        assert e["bytes"] == len(data), e["path"]
        assert e["digest"] == h.crc32c_hex(data), e["path"]
        assert len(data) > 0, e["path"]


def test_md5_digest_equals_hashlib(h, ckpt):
    root = ckpt("safetensors", 1, digest="md5")
    doc = h.read_manifest(root)
    assert doc["hash"] == "md5"
    files = h.files_under(root)
    assert {e["path"] for e in doc["files"]} == set(files) - {h.MANIFEST}
    for e in doc["files"]:
        assert e["digest"] == hashlib.md5(files[e["path"]]).hexdigest(), e["path"]
    r = h.run_cli("verify", root)
    assert r.rc == 0 and "OK" in r.out


@pytest.mark.parametrize("fmt, ranks", COMBOS)
def test_layout_of_each_format(h, ckpt, fmt, ranks):
    root = ckpt(fmt, ranks)
    names = set(os.listdir(root))
    doc = h.read_manifest(root)
    kinds = {e["path"]: (e["kind"], e["rank"]) for e in doc["files"]}
    if fmt == "safetensors":
        models = sorted(n for n in names if n.startswith("model-") and n.endswith(".safetensors"))
        assert models == [f"model-{i:05d}-of-{ranks:05d}.safetensors" for i in range(1, ranks + 1)]
        optims = sorted(n for n in names if n.startswith("optimizer-"))
        assert optims == [f"optimizer-{i:05d}-of-{ranks:05d}.safetensors" for i in range(1, ranks + 1)]
        for i, n in enumerate(models):
            assert kinds[n] == ("model", i)
        index = json.loads(open(os.path.join(root, "model.safetensors.index.json")).read())
        from safetensors import safe_open

        in_shards: dict[str, list[str]] = {}
        for n in models:
            with safe_open(os.path.join(root, n), framework="pt") as f:
                for k in f.keys():
                    in_shards.setdefault(k, []).append(n)
        assert all(len(v) == 1 for v in in_shards.values())  # every parameter exactly once
        assert index["weight_map"] == {k: v[0] for k, v in in_shards.items()}
        from ckptbench.checkpoint.model import GPT
        from ckptbench.checkpoint.profiles import ModelDims
        import torch

        with torch.device("meta"):
            gpt = GPT(ModelDims(**doc["dims"]))
        assert set(index["weight_map"]) == {n for n, _ in gpt.named_parameters()}
        total = sum(t.numel() * t.element_size() for t in h.read_tensors(root, fmt, None)[0].values())
        assert index["metadata"]["total_size"] == total
    elif fmt == "torch":
        pts = sorted(n for n in names if n.endswith(".pt"))
        expect = sorted([f"model_rank{r:03d}.pt" for r in range(ranks)] + [f"optim_rank{r:03d}.pt" for r in range(ranks)])
        assert pts == expect
        for r in range(ranks):
            assert kinds[f"model_rank{r:03d}.pt"] == ("model", r)
            assert kinds[f"optim_rank{r:03d}.pt"] == ("optimizer", r)
    else:
        assert ".metadata" in names
        shards = sorted(n for n in names if n.endswith(".distcp"))
        assert len(shards) == ranks
        assert all(kinds[n][0] == "model" for n in shards)
    for n in SMALL_ALWAYS:
        assert n in names and kinds[n][0] == "small", n
    assert sorted(n for n in names if n.startswith("rng_state_")) == sorted(f"rng_state_{r}.json" for r in range(ranks))
    loaders = sorted(os.listdir(os.path.join(root, "dataloader")))
    assert loaders and all(re.fullmatch(r"rank\d{3}_worker\d{4}\.idx", n) for n in loaders)
    assert {int(n[4:7]) for n in loaders} == set(range(ranks))
    small = [e for e in doc["files"] if e["kind"] == "small"]
    assert len(small) == 16  # the small profile's small_files
    config = json.loads(open(os.path.join(root, "config.json")).read())
    d = doc["dims"]
    assert (config["n_layer"], config["n_embd"], config["n_head"], config["vocab_size"], config["n_positions"]) == (
        d["layers"], d["hidden"], d["heads"], d["vocab"], d["seq_len"])


@pytest.mark.parametrize("fmt, ranks", COMBOS)
def test_load_round_trip_counts_parameters_independently(h, ckpt, fmt, ranks, tmp_path):
    root = ckpt(fmt, ranks)
    r = h.run_cli("load", root, "--optimizer-step", "--json")
    assert r.rc == 0, r.err
    out = json.loads(r.out)
    assert out["ok"] is True and out["problems"] == []
    assert out["format"] == fmt
    assert out["structural_only"] is False and out["verified"] is True
    assert out["finite_output"] is True and out["optimizer_step"] is True
    assert out["dtypes"] == {"weights": "bfloat16"}
    assert out["tail_files"] == 16
    doc = h.read_manifest(root)
    model, optim = h.read_tensors(root, fmt, tmp_path)
    independent = sum(t.numel() for t in model.values())
    assert out["param_count"] == doc["param_count"] == independent == h.gpt_param_count(**doc["dims"])
    assert {str(t.dtype) for t in model.values()} == {"torch.bfloat16"}
    # three fp32 optimizer tensors per parameter, same shapes as the weights
    opt_float = {k: t for k, t in optim.items() if t.is_floating_point()}
    assert sum(t.numel() for t in opt_float.values()) == 3 * independent
    assert {str(t.dtype) for t in opt_float.values()} == {"torch.float32"}


@pytest.mark.parametrize("fmt, ranks", COMBOS)
def test_no_tensor_is_all_zeros(h, ckpt, fmt, ranks, tmp_path):
    model, optim = h.read_tensors(ckpt(fmt, ranks), fmt, tmp_path)
    assert model and optim
    zeros = [k for k, t in {**model, **optim}.items() if t.numel() and not bool(t.ne(0).any())]
    assert zeros == []
    # and the weights are not a constant either
    assert all(t.float().std() > 0 for t in model.values() if t.numel() > 1)


def _digests(h, root) -> dict[str, str]:
    return {e["path"]: e["digest"] for e in h.read_manifest(root)["files"]}


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_same_seed_same_digests(h, ckpt, fmt, tmp_path):
    """A second run, in a fresh process, writes the same bytes."""
    again = tmp_path / "again"
    r = h.run_proc("gen", "small", again, "--scale", h.SCALE, "--format", fmt, "--ranks", "4", "--seed", "0")
    assert r.rc == 0, r.err
    first = _digests(h, ckpt(fmt, 4))
    second = _digests(h, again)
    assert set(first) == set(second)
    differ = sorted(p for p in first if first[p] != second[p])
    assert differ == []


def test_a_seed_writes_the_same_bytes_on_any_thread_count(h, tmp_path):
    """One thread and the box's count once gave other bytes (the step's reductions split another way), and a busy
    box's MKL picks fewer threads than asked: a gen of one seed must not depend on either."""
    one = tmp_path / "one"
    r = h.run_proc("gen", "small", one, "--scale", h.SCALE, "--format", "torch", "--seed", "0",
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert r.rc == 0, r.err
    many = tmp_path / "many"
    r = h.run_proc("gen", "small", many, "--scale", h.SCALE, "--format", "torch", "--seed", "0",
                   env={"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"})
    assert r.rc == 0, r.err
    assert _digests(h, one) == _digests(h, many)


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "dcp"])
def test_different_seed_different_data(h, ckpt, fmt):
    a = h.read_manifest(ckpt(fmt, 4, seed=0))
    b = h.read_manifest(ckpt(fmt, 4, seed=1))
    da = {e["path"]: e for e in a["files"]}
    db = {e["path"]: e for e in b["files"]}
    assert set(da) == set(db)
    for p, e in da.items():
        if e["kind"] in ("model", "optimizer") or p == "tokenizer.json" or p.startswith("dataloader/"):
            assert e["digest"] != db[p]["digest"], p
    assert b["seed"] == 1


# ---- bad input: one clear line, non-zero exit, nothing written -------------------------------------------


def _assert_one_error_line(r, *needles):
    assert r.rc != 0
    assert "Traceback" not in r.err
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error:"), r.err
    for n in needles:
        assert n in r.err_lines[0], r.err


def test_unknown_profile(h, tmp_path):
    r = h.run_proc("gen", "nosuchprofile", tmp_path / "ck", "--scale", h.SCALE)
    _assert_one_error_line(r, "unknown profile 'nosuchprofile'", "small", "7b")
    assert r.rc == 2
    assert h.listing(tmp_path) == []


def test_unknown_format_is_an_argparse_choice(h, tmp_path):
    r = h.run_cli("gen", "small", tmp_path / "ck", "--scale", h.SCALE, "--format", "onnx")
    assert r.rc == 2
    assert "invalid choice: 'onnx'" in r.err and "Traceback" not in r.err
    assert r.out == ""
    assert h.listing(tmp_path) == []


def test_unknown_format_in_a_profile_toml(h, tmp_path):
    src = open(os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "checkpoints", "small.toml")).read()
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace('format = "safetensors"', 'format = "onnx"'))
    r = h.run_cli("gen", bad, tmp_path / "ck", "--scale", h.SCALE)
    _assert_one_error_line(r, "unknown format 'onnx'")
    assert h.listing(tmp_path) == ["bad.toml"]



def test_a_profile_world_size_past_what_gen_writes_is_named_as_the_profiles(h, tmp_path):
    """A profile may hold up to 2**20 ranks for plan; gen refused it as '--ranks must be 1..4096', an option the
    user never gave (and whose own bound is 1..1024)."""
    src = open(os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "checkpoints", "small.toml")).read()
    bad = tmp_path / "wide.toml"
    bad.write_text(src.replace("world_size = 2", "world_size = 1048576"))
    r = h.run_cli("gen", bad, tmp_path / "ck", "--scale", h.SCALE)
    _assert_one_error_line(r, "world_size 1048576", "--ranks N")
    assert "--ranks must" not in r.err
    assert h.listing(tmp_path) == ["wide.toml"]

def test_parent_is_a_regular_file(h, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_bytes(b"not a directory")
    r = h.run_cli("gen", "small", blocker / "ck", "--scale", h.SCALE)
    _assert_one_error_line(r, str(blocker))
    assert r.rc == 2
    assert h.listing(tmp_path) == ["afile"] and blocker.read_bytes() == b"not a directory"


def test_target_is_a_regular_file(h, tmp_path):
    target = tmp_path / "ck"
    target.write_bytes(b"keep me")
    r = h.run_cli("gen", "small", target, "--scale", h.SCALE, "--force")
    _assert_one_error_line(r, "not a directory")
    assert h.listing(tmp_path) == ["ck"] and target.read_bytes() == b"keep me"


def test_parent_not_writable_for_an_unprivileged_user(h):
    """Root ignores mode bits, so as root the CLI runs as uid/gid 65534 (forked: no exec of a root-only
    interpreter); as any other user the directory is simply made read-only."""
    from ckptbench.cli import root as cli  # noqa: F401  imported before the fork: uid 65534 cannot read /root
    from ckptbench.checkpoint import generate

    as_root = os.geteuid() == 0
    parent = tempfile.mkdtemp(prefix="ckptbench-ro-")
    try:
        # as root: root-owned, searchable by all, writable by root only; otherwise: read-only for its owner too
        os.chmod(parent, 0o755 if as_root else 0o555)
        err_path = os.path.join(tempfile.mkdtemp(prefix="ckptbench-err-"), "stderr")
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT, 0o600)
        pid = os.fork()
        if pid == 0:  # child
            code = 99
            try:
                os.dup2(err_fd, 2)
                sys.stderr = open(2, "w", closefd=False)  # past pytest's capture, into the file
                if as_root:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                code = cli.main(["gen", "small", os.path.join(parent, "ck"), "--scale", h.SCALE])
            except BaseException as exc:  # anything escaping main is itself a failure: report it
                os.write(2, f"escaped: {type(exc).__name__}: {exc}\n".encode())
                code = 98
            finally:
                try:
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(err_fd)
        _, status = os.waitpid(pid, 0)
        err = open(err_path).read()
        os.unlink(err_path)
        os.rmdir(os.path.dirname(err_path))
        assert os.WEXITSTATUS(status) == 1, err  # the system refused the write: the command was right (docs/reference.md, exit status)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("ckptbench: error:") and "not writable" in lines[0], err
        assert os.listdir(parent) == []
    finally:
        os.chmod(parent, 0o755)
        for n in os.listdir(parent):
            shutil.rmtree(os.path.join(parent, n), ignore_errors=True)
        os.rmdir(parent)


def test_not_enough_disk(h, tmp_path):
    r = h.run_cli("gen", "70b", tmp_path / "ck", "--scale", "1000")  # about 900 TiB: no disk here has that
    _assert_one_error_line(r, "GiB free", "needs")
    assert r.rc == 1  # the system's place is too small: the command was right (docs/reference.md, exit status)
    assert h.listing(tmp_path) == []


def test_non_empty_dir_without_force_is_left_alone(h, tmp_path):
    target = tmp_path / "ck"
    target.mkdir()
    (target / "precious.txt").write_bytes(b"precious")
    r = h.run_cli("gen", "small", target, "--scale", h.SCALE)
    _assert_one_error_line(r, "not empty", "--force")
    assert r.rc == 2
    assert h.listing(tmp_path) == ["ck", "ck/precious.txt"]
    assert (target / "precious.txt").read_bytes() == b"precious"


def test_force_replaces_whole_directory(h, ckpt, tmp_path):
    target = tmp_path / "ck"
    h.copy_ckpt(ckpt("torch", 1), target)  # a file the manifest does not list is refused (test_hardening10)
    old = h.read_manifest(target)
    r = h.run_cli("gen", "small", target, "--scale", h.SCALE, "--format", "safetensors", "--ranks", "2",
                  "--seed", "3", "--force")
    assert r.rc == 0, r.err
    assert h.listing(tmp_path) == sorted(["ck"] + [f"ck/{p}" for p in h.listing(target)])  # no temp dirs beside
    assert not any(n.startswith(".ck") for n in os.listdir(tmp_path))
    names = set(os.listdir(target))
    assert "model_rank000.pt" not in names
    new = h.read_manifest(target)
    assert new["format"] == "safetensors" and new["seed"] == 3 and new["world_size"] == 2 and new != old
    files = h.files_under(target)
    assert set(files) - {h.MANIFEST} == {e["path"] for e in new["files"]}
    for e in new["files"]:
        assert h.crc32c_hex(files[e["path"]]) == e["digest"]


def test_force_that_fails_keeps_the_old_checkpoint(h, ckpt, tmp_path):
    target = tmp_path / "ck"
    h.copy_ckpt(ckpt("torch", 1), target)
    before = h.snapshot(target)
    r = h.run_cli("gen", "70b", target, "--scale", "1000", "--force")
    _assert_one_error_line(r, "needs")
    assert h.snapshot(target) == before
    assert os.listdir(tmp_path) == ["ck"]


# ---- interrupted and killed gens: no temporary sibling left behind ----------------------------------------


def _host() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_gen_interrupted_mid_write_leaves_no_temporary_sibling(h, tmp_path, monkeypatch, exc):
    """The shards are written, then the small files fail: ^C (the CLI's exit 130) or a bug (the exception escapes)."""
    from ckptbench.checkpoint import generate

    real = generate.write_small_files
    seen = []

    def half_then_fail(directory, *args):
        real(directory, *args)
        seen.append(sorted(os.listdir(tmp_path)))
        seen.append(sorted(os.listdir(directory)))
        raise exc("stopped mid-write")

    monkeypatch.setattr(generate, "write_small_files", half_then_fail)
    target = tmp_path / "ck"
    if exc is KeyboardInterrupt:
        r = h.run_cli("gen", "small", target, "--scale", h.SCALE, "--format", "torch")
        assert r.rc == 130 and "interrupted" in r.err and "Traceback" not in r.err
    else:
        with pytest.raises(RuntimeError, match="stopped mid-write"):
            h.run_cli("gen", "small", target, "--scale", h.SCALE, "--format", "torch")
    assert seen[0] == [f".ck.tmp-{_host()}-{os.getpid()}"]  # it wrote into a temporary sibling named by host and pid
    assert "model_rank000.pt" in seen[1] and "config.json" in seen[1]
    assert h.listing(tmp_path) == []


def _staged_by_a_process(target, *, twice: bool = False, stay: bool = False):
    """Staging folders of `target` made and marked by another process, as gen makes them (the second, with `twice`,
    under the fallback name); with `stay` that process lives on until killed. Returns (process, folders)."""
    import subprocess

    code = (f"from ckptbench.core.staging import make_staging; print(make_staging({str(target)!r}), flush=True)"
            + (f"; print(make_staging({str(target)!r}), flush=True)" if twice else "")
            + ("; import time; time.sleep(300)" if stay else ""))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    made = [os.path.basename(proc.stdout.readline().strip()) for _ in range(2 if twice else 1)]
    if not stay:
        proc.wait()
    return proc, made


def test_gen_removes_stale_siblings_of_dead_processes_only(h, tmp_path):
    """Only a staging folder that holds the marker a gen writes into it first, naming that folder and this host, and
    whose process has ended, is removed: before the marker, any folder named like one with a dead pid was deleted,
    with whatever the user kept there."""
    import json
    import subprocess

    _, stale = _staged_by_a_process(tmp_path / "ck", twice=True)  # the second: the fallback name
    live, kept = _staged_by_a_process(tmp_path / "ck", stay=True)  # a gen still writing
    try:
        _, other = _staged_by_a_process(tmp_path / "other")  # another target's
        kept += other
        done = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE,
                                text=True)
        dead = int(done.communicate()[0])
        host = _host()
        away = tmp_path / f".ck.tmp-otherhost-{dead}"  # another node's, on a shared file system: its pids are not ours
        os.rename(tmp_path / _staged_by_a_process(tmp_path / "ck")[1][0], away)
        (away / ".ckptbench-staging").write_text(json.dumps({"folder": away.name, "host": "otherhost", "pid": dead}))
        kept.append(away.name)
        unmarked = [f".ck.tmp-{host}-{dead}", f".ck.tmp-{dead}"]  # named like ours, no marker: the user's
        # named as the old checkpoint a swap that died between renames set aside, and holding a ckptbench.json, but
        # not a checkpoint gen wrote: a '{}' beside the user's files, once deleted with them
        planted = f".ck.tmp-{host}-{dead}-0123abcd.old"
        kept += unmarked + [planted, f".ck.tmp-{host}-{dead}.old"]
        for n in stale + kept:
            os.makedirs(tmp_path / n / "dataloader", exist_ok=True)
            (tmp_path / n / "dataloader" / "part.idx").write_bytes(b"half")
        (tmp_path / planted / "ckptbench.json").write_text("{}")
        r = h.run_cli("gen", "small", tmp_path / "ck", "--scale", h.SCALE, "--format", "torch")
        assert r.rc == 0, r.err
        assert sorted(os.listdir(tmp_path)) == sorted(["ck"] + kept)
        for n in kept:
            assert (tmp_path / n / "dataloader" / "part.idx").read_bytes() == b"half", n
        assert sorted(line for line in r.err.splitlines() if "staging folder" in line) == sorted(
            f"removed {tmp_path / n}: the staging folder of a gen that was killed before it finished" for n in stale)
        assert live.poll() is None  # the live one really was alive throughout
        # once the target exists, the set-aside old checkpoint of a dead swap (one gen wrote, whole) is stale too
        shutil.rmtree(tmp_path / kept[-1])
        shutil.copytree(tmp_path / "ck", tmp_path / kept[-1])
        r = h.run_cli("gen", "small", tmp_path / "ck", "--scale", h.SCALE, "--format", "torch", "--force")
        assert r.rc == 0, r.err
        assert sorted(os.listdir(tmp_path)) == sorted(["ck"] + kept[:-1])
        assert (tmp_path / planted / "dataloader" / "part.idx").read_bytes() == b"half"
    finally:
        live.kill()
        live.wait()


def test_gen_counts_its_files_as_run_lists_them(h, tmp_path):
    """A new user read "21 files" from gen and "22 files" from run for one directory: the manifest is a file too."""
    out = tmp_path / "ck"
    r = h.run_cli("gen", "small", out, "--scale", h.SCALE)
    assert r.rc == 0, r.err
    n = int(re.search(r"(\d+) files \+ the manifest", r.out).group(1))
    assert n + 1 == sum(1 for p in out.rglob("*") if p.is_file())
