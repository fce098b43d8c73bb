"""Bad S3 input: a missing bucket, an empty prefix, refused credentials, an unreachable endpoint, an object deleted
mid-run. Each is one line and exit 2 (or a failed file with its class), never a traceback."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from s3help import files_under, put_dir, one_line_error, run_cli

import ckptbench.cli.run  # noqa: F401  (imported before any per-test stream redirection)
from ckptbench.sources import s3 as s3mod
from ckptbench.sources import s3read, s3source

PARTIAL = s3read.STAGE_SUFFIX


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("bad") / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    return str(root)


def command(cmd: str, url: str, tmp_path) -> list:
    return {
        "run": ["run", url, "--repeat", "1", "--results", tmp_path / "r.csv"],
        "read": ["read", url],
        "sweep": ["sweep", url, "--levels", "1", "--repeat", "1"],
        "check": ["check", url],
    }[cmd]


@pytest.mark.parametrize("cmd", ["run", "read", "sweep", "check"])
def test_missing_bucket(s3env, tmp_path, cmd):
    rc, out, err = run_cli(*command(cmd, "s3://ckptbench-no-such-bucket/ckpt", tmp_path))
    line = one_line_error(rc, err, "ckptbench-no-such-bucket", "does not exist")
    assert out == ""
    assert line.startswith("ckptbench: error:")
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("cmd", ["run", "read", "sweep", "check"])
def test_empty_prefix(s3server, s3env, s3bucket, tmp_path, cmd):
    s3server.client(direct=True).put_object(Bucket=s3bucket, Key="other/x.bin", Body=b"x")
    rc, _, err = run_cli(*command(cmd, f"s3://{s3bucket}/nothing-here", tmp_path))
    one_line_error(rc, err, "no objects", f"s3://{s3bucket}/nothing-here")


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix"])
def test_url_without_bucket(s3env, tmp_path, url):
    rc, _, err = run_cli(*command("run", url, tmp_path))
    one_line_error(rc, err, "no bucket name")


@pytest.fixture
def iam_user(s3server):
    """An IAM user with full S3 rights and an access key, created in moto's IAM (moto serves every service)."""
    import boto3

    iam = boto3.session.Session().client("iam", endpoint_url=s3server.direct_url, region_name="us-east-1",
                                         aws_access_key_id="x", aws_secret_access_key="x")
    name = f"ckptbench-{os.urandom(4).hex()}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_access_denied_for_a_wrong_secret_key(s3server, s3env, s3bucket, iam_user, monkeypatch, tmp_path):
    """moto checks SigV4 signatures once its IAM simulation is on (enable_iam_authentication): a real access key id
    with a wrong secret gets SignatureDoesNotMatch (403). The right secret is the control: it reads."""
    from moto.core.authorization import enable_iam_authentication

    s3server.client(direct=True).put_object(Bucket=s3bucket, Key="ck/a.bin", Body=b"abc" * 1000)
    key_id, secret = iam_user
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    with enable_iam_authentication():
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        rc, _, err = run_cli("read", f"s3://{s3bucket}/ck")
        assert rc == 0, err
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret[::-1])
        for cmd in ("run", "read", "sweep", "check"):
            rc, out, err = run_cli(*command(cmd, f"s3://{s3bucket}/ck", tmp_path))
            one_line_error(rc, err, "access denied", s3bucket)
            assert secret[::-1] not in err + out and key_id not in err + out


def test_access_denied_for_an_unknown_access_key(s3server, s3env, s3bucket, tmp_path):
    from moto.core.authorization import enable_iam_authentication

    s3server.client(direct=True).put_object(Bucket=s3bucket, Key="ck/a.bin", Body=b"abc")
    with enable_iam_authentication():  # "testing-key-id" is in no IAM user: InvalidAccessKeyId (403)
        rc, _, err = run_cli(*command("run", f"s3://{s3bucket}/ck", tmp_path))
    one_line_error(rc, err, "access denied")


@pytest.mark.parametrize("cmd", ["run", "read"])
def test_unreachable_endpoint(s3env, monkeypatch, tmp_path, cmd):
    """Nothing listens on 127.0.0.1:1. botocore's 10 attempts with backoff take ~25 s, so the client here
    retries once; the path to the message is the same."""
    real = s3mod.make_client
    monkeypatch.setattr(s3mod, "make_client",
                        lambda concurrency=16, **kw: real(concurrency, **{**kw, "max_attempts": 1}))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    rc, _, err = run_cli(*command(cmd, "s3://some-bucket/ckpt", tmp_path))
    one_line_error(rc, err, "cannot reach", "http://127.0.0.1:1")


def test_object_deleted_mid_run(s3faulty, ckpt, monkeypatch, tmp_path):
    """The biggest shard is deleted after some of its bytes arrived: that file fails as missing, every other file is
    restored, the stage directory holds no partial file, and the CLI reports it without a traceback."""
    server = s3faulty(fault_rate=0.0, latency_s=0.1)
    bucket = server.make_bucket()
    direct = server.client(direct=True)
    put_dir(direct, bucket, "ck", ckpt)
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    local = files_under(ckpt)
    target = max(local, key=lambda r: len(local[r]))
    handles = []
    real_start = s3source.start
    monkeypatch.setattr(s3source, "start", lambda *a, **kw: handles.append(real_start(*a, **kw)) or handles[-1])
    deleted = threading.Event()

    def deleter():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if handles:
                ob = next(o for o in handles[0].objs if o.o.rel == target)
                if ob.bytes > 0:
                    direct.delete_object(Bucket=bucket, Key=f"ck/{target}")
                    deleted.set()
                    return
            time.sleep(0.005)

    t = threading.Thread(target=deleter, daemon=True)
    t.start()
    stage = tmp_path / "stage"
    rc, out, err = run_cli("run", f"s3://{bucket}/ck", "--stage-dir", stage, "--part-size", "64K", "-c", "4",
                           "--repeat", "1", "--json", "--results", tmp_path / "r.csv")
    t.join(5)
    assert deleted.is_set()
    assert "Traceback" not in err
    assert rc == 1, err
    doc = json.loads(out)
    assert doc["status"] == "failed"
    assert doc["errors"] == {s3mod.MISSING: 1}
    assert doc["success_rate"] == pytest.approx((doc["files"] - 1) / doc["files"])
    (problem,) = doc["repeats"][0]["problems"]
    assert problem.startswith(f"{target}: ") and "missing" in problem
    (res_file,) = [f for f in handles[0].wait().files if f.error is not None]
    assert res_file.path.endswith(target) and 0 < res_file.bytes < len(local[target])  # it failed part-way
    staged = files_under(stage)
    assert not [p for p in staged if p.endswith(PARTIAL)]
    assert staged == {rel: data for rel, data in local.items() if rel != target}


def test_no_credentials_anywhere_says_where_they_go(s3env, s3bucket, monkeypatch, tmp_path):
    """botocore finds no key (none in the environment, no profile, no instance role): the line says where one goes,
    not "retry later or check the endpoint"."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    rc, _, err = run_cli(*command("run", f"s3://{s3bucket}/ck", tmp_path))
    one_line_error(rc, err, "no AWS access key was found", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")
    assert "retry later" not in err


def test_credentials_written_into_the_url_are_refused_and_never_printed(s3env, tmp_path):
    rc, out, err = run_cli(*command("run", "s3://AKIAIOSFODNN7EXAMPLE:sEcReT@bucket/ck", tmp_path))
    one_line_error(rc, err, "user or credentials before its bucket", "AWS_ACCESS_KEY_ID")
    assert "sEcReT" not in out + err and "AKIAIOSFODNN7EXAMPLE" not in out + err
