"""A hostile or broken S3 endpoint: crafted listings, bodies and error answers from a small threaded HTTP server on
127.0.0.1 (s3hostile; botocore talks to it for real), and hostile object names put in the local moto server. Each
must give one line and a non-zero exit (or a failed file with its class), bounded work, nothing outside the output
directory, and no credential in any output."""

from __future__ import annotations

import hashlib
import os
import pathlib
from urllib.parse import urlsplit

import pytest
from s3help import files_under, one_line_error, run_cli
from s3hostile import TOKEN, Handler, failed_file, listing, no_credentials, part_retries, s3_error

import ckptbench.cli.run  # noqa: F401  (imported before any per-test stream redirection)
from ckptbench.checkpoint import manifest as mf
from ckptbench.sources import s3 as s3mod
from ckptbench.sources import s3read


# --- the listing ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("token", ["fresh", "cycle", "empty"])
def test_a_listing_that_never_ends_stops(hostile, monkeypatch, token):
    """IsTruncated true forever: a fresh token each page, two tokens in turn (botocore only catches one repeated
    twice in a row), or empty pages. It stops at the page bound with one line instead of listing forever."""
    monkeypatch.setattr(s3mod, "MAX_PAGES", 20)
    keys = {"fresh": lambda n: [(f"ck/a{n}.bin", 10)], "cycle": lambda n: [("ck/a.bin", 10)], "empty": lambda n: []}
    hostile.pages = lambda n: listing(keys[token](n), True, f"t{n % 2}" if token == "cycle" else f"t{n}")
    rc, out, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, "s3://b/ck", "did not end after 20 pages")
    assert len(hostile.requests) == 21
    no_credentials(out, err)


def test_a_repeated_continuation_token_is_one_line(hostile):
    hostile.pages = lambda n: listing([("ck/a.bin", 10)], True, "same")
    rc, _, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, "repeats its continuation token")


def test_more_objects_than_one_checkpoint_has(hostile, monkeypatch):
    monkeypatch.setattr(s3mod, "MAX_OBJECTS", 50)
    hostile.pages = lambda n: listing([(f"ck/p{n}/f{i}.bin", 10) for i in range(40)], True, f"t{n}")
    rc, _, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, "more than 50 objects")
    assert len(hostile.requests) == 2  # the bound stops the listing, not only what is kept of it


@pytest.mark.parametrize("size, words", [("-5", "the size -5"), (str(1 << 62), f"the size {1 << 62}"),
                                         (str(10 ** 30), "the size 1000000000000000000000000000000"),
                                         ("abc", "not a valid S3 response"), ("1e3", "not a valid S3 response")])
@pytest.mark.parametrize("cmd", ["read", "run"])
def test_a_listed_size_no_object_has(hostile, tmp_path, size, words, cmd):
    """Before: -5 read as bytes 0--6, 2**62 built a task per part until MemoryError, "abc" was botocore's ValueError
    (tracebacks). The listing is refused before any GET."""
    hostile.pages = lambda n: listing([("ck/a.bin", size)])
    args = ["run", "--repeat", "1", "--results", tmp_path / "r.csv"] if cmd == "run" else ["read"]
    rc, out, err = run_cli(args[0], "s3://b/ck", *args[1:])
    one_line_error(rc, err, "s3://b/ck", words)
    assert not hostile.gets("ck/a.bin")
    assert not (tmp_path / "r.csv").exists()
    no_credentials(out, err)


@pytest.mark.parametrize("keys, words", [
    (["other/a.bin", "../../etc/passwd"], "outside the prefix"),
    (["ck/a.bin", "ck/a.bin"], "twice"),
    (["ck/a\x00b.bin"], "not a plain relative path"),
    (["ck/\x1b]0;owned\x07\x1b[2Ja.bin"], "not a plain relative path"),
    (["ck/a", "ck/a/b"], "both as an object and as the folder"),
])
def test_a_crafted_listing_is_refused(hostile, tmp_path, keys, words):
    """Keys the endpoint made up: outside the prefix asked for (before, its rest became a path: "other/a.bin" read
    as s3://b/ck/er/a.bin), listed twice (two writers of one staged file), a NUL or a terminal escape."""
    hostile.objects = {k: b"x" * 10 for k in keys}
    hostile.pages = lambda n: listing([(k, 10) for k in keys])
    stage = tmp_path / "stage"
    rc, out, err = run_cli("run", "s3://b/ck", "--stage-dir", stage, "--repeat", "1", "--results", tmp_path / "r.csv")
    line = one_line_error(rc, err, words)
    assert "\x1b" not in out + err and "\x00" not in line
    assert not [p for p, _ in hostile.requests if urlsplit(p).path.startswith("/b/")]  # nothing fetched
    assert files_under(tmp_path) == {}


def test_a_listing_entry_without_a_key(hostile):
    hostile.pages = lambda n: b"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Size>10</Size>" \
                              b"</Contents></ListBucketResult>"
    rc, _, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, "names None")


@pytest.mark.parametrize("answer, words", [
    ((307, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""), "redirect"),
    ((301, {}, b"<Error><Code>PermanentRedirect</Code><Endpoint>evil.example</Endpoint></Error>"), "redirect"),
    ((200, {}, b"<ListBucketResult><Contents><Key>ck/a</Key><Size>1</Si"), "S3 error"),
    (s3_error(500, "InternalError", "A" * (1 << 20)), "S3 error (server_error)"),
])
def test_a_broken_listing_answer_is_one_line(hostile, answer, words):
    """Redirects are not followed (a Location at the metadata service included), XML cut short and a 1 MiB error
    body end in one line, after botocore's bounded retries."""
    hostile.pages = answer
    rc, out, err = run_cli("read", "s3://b/ck")
    line = one_line_error(rc, err, words)
    assert len(line) < 400
    assert len(hostile.requests) <= 2 * 2  # botocore's 2 attempts (a HEAD to find the bucket's region at most)
    no_credentials(out, err)


def test_entity_expansion_in_a_listing(hostile):
    """A billion laughs: expat refuses the amplification, botocore's parser fails, and the listing is one line."""
    entities = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    hostile.pages = lambda n: (f'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY l0 "lol">{entities}]>'
                               "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>ck/&l9;</Key>"
                               "<Size>1</Size></Contents></ListBucketResult>").encode()
    rc, _, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, "s3://b/ck")


# --- the GETs ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how, cls", [("whole", "size_mismatch"), ("extra", "size_mismatch"),
                                      ("cut", "connection_reset")])
def test_a_body_not_the_size_asked_for(hostile, monkeypatch, how, cls):
    """200 with the whole object to a ranged GET, bytes beyond the listed size (it grew since the listing), or a
    Content-Length that lies (the body ends early): the file fails with its class, no byte counted."""
    kw = {"whole": {"whole": True}, "extra": {"extra": b"more"}, "cut": {"cut": 100}}[how]
    hostile.get = lambda h, key, rng: hostile.serve_range(h, key, rng, **kw)
    part_retries(monkeypatch, 1)
    rc, out, err = run_cli("read", "s3://b/ck", "--part-size", "64K")
    failed_file(rc, err, "s3://b/ck/a.bin", cls)
    no_credentials(out, err)


def test_a_stalled_body_times_out(hostile, monkeypatch):
    """Headers, a few bytes, then nothing: each attempt ends at the read timeout, and the attempts are bounded."""
    monkeypatch.setattr(s3mod, "READ_TIMEOUT_S", 0.3)

    def stall(h, key, rng):
        h.send_response(200)
        h.send_header("Content-Length", str(len(hostile.objects[key])))
        h.end_headers()
        h.wfile.write(b"abc")
        h.wfile.flush()
        hostile.release.wait(30)

    hostile.get = stall
    part_retries(monkeypatch, 2)
    rc, _, err = run_cli("read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin", "timeout")
    assert len(hostile.gets("ck/a.bin")) == 3  # ours: the first attempt and 2 retries


def test_an_error_status_is_not_retried_twice_over(hostile):
    """5xx forever: botocore retries each GET (AWS_MAX_ATTEMPTS=2) and that is all. Before, ckptbench retried every
    part's exhausted GET 5 times more (x6 the requests and the backoff; docs/s3.md: ours are for a cut body)."""
    hostile.get = lambda h, key, rng: h._answer(*s3_error(500, "InternalError"))
    rc, _, err = run_cli("read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin", "server_error", "InternalError, HTTP 500")
    assert len(hostile.gets("ck/a.bin")) == 2


def test_a_redirect_loop_fails_the_file(hostile, monkeypatch):
    """A 307 to every GET (and to the HEAD botocore sends to find the region): botocore follows it into itself until
    the stack runs out. Before, that RecursionError killed the worker thread with a traceback and the file read as
    "cancelled"; now the file fails, named and classed."""
    hostile.get = lambda h, key, rng: h._answer(307, {"Location": f"{hostile.url}/b/{key}"}, b"")
    monkeypatch.setattr(Handler, "do_HEAD", lambda h: h._answer(307, {"Location": hostile.url}, b"", head=True))
    rc, _, err = run_cli("read", "s3://b/ck")
    failed_file(rc, err, "s3://b/ck/a.bin")
    assert "cancelled" not in err


@pytest.mark.usefixtures("box_floor")
@pytest.mark.parametrize("where", ["Message", "Code"])
def test_an_error_echoing_the_request_leaks_nothing(hostile, tmp_path, where):
    """An error answer that echoes the request back: its headers (the signature, the key id) and the session token
    bare, in the message or in place of the code. No output, JSON document, results file or floor cache holds a
    credential; the endpoint's user-info never shows either."""
    def echo(h, key, rng):
        text = h.headers.get("X-Amz-Security-Token", "") + " " + "; ".join(f"{k}: {v}" for k, v in h.headers.items())
        h._answer(*(s3_error(403, "AccessDenied", text) if where == "Message" else s3_error(400, text)))

    hostile.get = echo
    texts = []
    for args in (["read", "--json"], ["run", "--json", "--repeat", "1", "--results", tmp_path / "r.csv"],
                 ["floor"]):
        rc, out, err = run_cli(args[0], "s3://b/ck", *args[1:])
        assert rc in (1, 2) and "Traceback" not in err, err
        texts += [out, err]
    assert any(TOKEN in str(h) for _, h in hostile.requests)  # the token did reach the endpoint
    cache = pathlib.Path(os.environ["XDG_CACHE_HOME"])
    texts += [p.read_text(errors="replace") for p in (*tmp_path.rglob("*"), *cache.rglob("*")) if p.is_file()]
    no_credentials(*texts)


def test_the_manifest_is_fetched_no_further_than_its_bound(hostile):
    """A manifest is parsed whole, so it is fetched with a bounded range, and one listed beyond the bound is refused
    before its GET. Before, it was read whole whatever its size (and whatever the server sent)."""
    doc = b'{"version": 1}'
    hostile.objects["ck/" + mf.MANIFEST_NAME] = doc
    rc, _, err = run_cli("read", "s3://b/ck")
    (get,) = hostile.gets("ck/" + mf.MANIFEST_NAME)
    assert get.get("Range") == f"bytes=0-{mf.MAX_BYTES}", get
    hostile.pages = lambda n: listing([("ck/a.bin", 10), ("ck/" + mf.MANIFEST_NAME, mf.MAX_BYTES + 1)])
    hostile.requests.clear()
    rc, _, err = run_cli("read", "s3://b/ck")
    one_line_error(rc, err, mf.MANIFEST_NAME, f"at most {mf.MAX_BYTES}")
    assert not hostile.gets("ck/" + mf.MANIFEST_NAME)


# --- hostile names in a real (moto) bucket --------------------------------------------------------------------------

def put(s3server, bucket: str, keys: list[str]) -> None:
    direct = s3server.client(direct=True)
    for k in keys:
        direct.put_object(Bucket=bucket, Key=k, Body=b"x" * 100)


@pytest.mark.parametrize("key", ["ck/../evil.bin", "ck//etc/evil.bin", "ck/./b.bin", "ck/a/../../evil.bin",
                                 "ck/\x1b]0;owned\x07\x1b[2Jx.bin", "ck/b\x01\x7f.bin", "ck/b\u202egnp.exe"])
@pytest.mark.parametrize("cmd", ["read", "run"])
def test_a_key_that_is_no_plain_path(s3server, s3env, s3bucket, tmp_path, key, cmd):
    """Before, `read` read these (0), `run` loaded ck/../evil.bin as s3://…/ck/../evil.bin, and a staged run said
    "the pack: member …". Now the listing is refused in one line that shows the key escaped."""
    put(s3server, s3bucket, ["ck/a.bin", key])
    (tmp_path / "out").mkdir()
    stage = tmp_path / "out" / "stage"
    args = ["--stage-dir", stage, "--repeat", "1", "--results", tmp_path / "out" / "r.csv"] if cmd == "run" else []
    rc, out, err = run_cli(cmd, f"s3://{s3bucket}/ck", *args)
    one_line_error(rc, err, "not a plain relative path")
    assert "\x1b" not in out + err and "\u202e" not in out + err
    assert files_under(tmp_path) == {}  # ck/../evil.bin staged would land in out/


def test_a_file_that_is_also_a_folder(s3server, s3env, s3bucket, tmp_path):
    put(s3server, s3bucket, ["ck/a", "ck/a/b"])
    rc, _, err = run_cli("run", f"s3://{s3bucket}/ck", "--stage-dir", tmp_path / "st", "--repeat", "1")
    one_line_error(rc, err, "'a' both as an object and as the folder of 'a/b'")


def test_a_key_named_like_a_temporary_file(s3server, s3env, s3bucket, tmp_path):
    """"a.bin" stages through "a.bin.ckptbench-partial", the final name of the other key: one would be renamed onto
    the other's name half-written. Refused before a byte is written."""
    put(s3server, s3bucket, ["ck/a.bin", "ck/a.bin" + s3read.STAGE_SUFFIX])
    stage = tmp_path / "st"
    rc, _, err = run_cli("run", f"s3://{s3bucket}/ck", "--stage-dir", stage, "--repeat", "1")
    assert "Traceback" not in err and rc == 1, err
    assert s3read.STAGE_SUFFIX in err and "rename the object" in err
    assert files_under(tmp_path) == {}


def test_a_name_too_long_to_stage(s3server, s3env, s3bucket, tmp_path):
    """A 300-character name is a valid key but no local file name: that file fails as a stage problem. Before, the
    OSError killed a worker thread with a traceback and the file read as "cancelled"."""
    put(s3server, s3bucket, ["ck/a.bin", "ck/" + "x" * 300])
    stage = tmp_path / "st"
    rc, _, err = run_cli("run", f"s3://{s3bucket}/ck", "--stage-dir", stage, "--repeat", "1", "--results",
                         tmp_path / "r.csv")
    failed_file(rc, err, "stage", "File name too long", "--stage-dir")
    assert "cancelled" not in err
    assert not [p for p in files_under(stage) if p.endswith(s3read.STAGE_SUFFIX)]


def test_md5_of_a_multipart_object_still_verifies(s3server, s3env, s3bucket, tmp_path):
    """The per-part records are kept by part, not in a slot per part: a multipart ETag still checks."""
    from ckptbench.sources import open_source
    from ckptbench.sources.base import ReadOptions

    body = os.urandom((5 << 20) * 2 + 999)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.bin").write_bytes(body)
    s3mod.upload(str(tmp_path / "src"), s3mod.parse(f"s3://{s3bucket}/m"), concurrency=4, part_size=5 << 20)
    source = open_source(f"s3://{s3bucket}/m")
    res = source.start_read(source.list(), ReadOptions(concurrency=4, part_size=5 << 20, hash="md5"))
    out = res.wait(60)
    assert [f.error for f in out.files] == [None]
    assert res.objs[0].verified_s3 is True and res.objs[0].digest == hashlib.md5(body).hexdigest()
    assert res.error_classes() == {}
