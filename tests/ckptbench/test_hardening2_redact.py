"""errors.redact: every shape a credential takes on a command line, in an error or a config line vanishes; ordinary
text stays. A name that merely contains a credential word (`author=`, `--tokenizer PATH`) loses its value too:
cosmetic, and never a leak (README, "Secrets")."""

from __future__ import annotations

import pytest

from ckptbench.core.errors import printable, redact

S = "hunter2XyZ"  # every secret below is built from this, so one check finds any leak

# (text, what must remain) — the secret S must be gone from each
LEAKS = [
    # URL user-info, up to the last @ of the authority
    (f"https://alice:{S}@host.example/x", "https://host.example/x"),
    (f"s3://AKID:{S}/with/slash@bucket/key", "s3://bucket/key"),
    (f"http://bob:p@ss{S}@proxy:3128", "http://proxy:3128"),
    (f"https://{S}@github.com/org/repo.git", "https://github.com/org/repo.git"),
    (f"git clone https://x:{S}@h/r.git into", "git clone https://h/r.git into"),
    (f"proxy bob:{S}@proxy.corp:8080", "proxy proxy.corp:8080"),
    # key=value in its forms, any name holding a credential word, any case
    (f"AWS_SECRET_ACCESS_KEY={S} python t.py", "python t.py"),
    (f"aws_session_token={S}", "aws_session_token="),
    (f"--aws-secret-access-key={S} x", " x"),
    (f"--aws-session-token {S} --concurrency 8", "--concurrency 8"),
    (f"--password {S}", "--password"),
    (f"-p x --db-password={S}", "-p x --db-password="),
    (f"PASSWD={S}", "PASSWD="),
    (f"HF_TOKEN={S} torchrun", "torchrun"),
    (f"--hf-token {S}", "--hf-token"),
    (f"api_key={S}&page=2", "&page=2"),
    (f"https://h/x?apikey={S}&page=2", "https://h/x?apikey="),
    (f"--api-key {S}", "--api-key"),
    (f"X-Api-Key: {S}", "X-Api-Key:"),
    (f"client_secret: {S}", "client_secret:"),
    (f"SESSION_ID={S}", "SESSION_ID="),
    (f"db_credentials={S}", "db_credentials="),
    (f"aws_secret_access_key = {S}", "aws_secret_access_key ="),
    (f"password '{S} with spaces'", "password"),
    (f'password="{S} with spaces" next', "next"),
    (f"secret {S}", "secret"),
    (f"AWS_SECRET_ACCESS_KEY wJalrXUtnFEMI/K7MDENG/bPxRfiCY{S}", "AWS_SECRET_ACCESS_KEY"),
    # JSON
    (f'{{"password": "{S}", "n": 1}}', '"n": 1'),
    (f'{{"apiKey":"{S}"}}', '"apiKey"'),
    (f'{{"token": "a\\"{S}"}}', '"token"'),
    (f"{{'secret': '{S}'}}", "'secret'"),
    # Authorization headers, the whole value
    (f"Authorization: Bearer {S} https://h/x", "https://h/x"),
    (f"-H 'Authorization: Basic {S}=='", "Authorization:"),
    (f"authorization: AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/s3/aws4_request, "
     f"SignedHeaders=host;x-amz-date, Signature={S}", "authorization:"),
    (f"Proxy-Authorization: Basic {S} tail", "tail"),
]

KEY_IDS = ["AKIAIOSFODNN7EXAMPLE", "ASIAQWERTYUIOPASDFGH"]

KEPT = [
    "/home/alice/checkpoints/step-000001/model.safetensors",
    "python train.py --concurrency 8 --repeats 3",
    "/data/my_secret_project/run.py",
    "/srv/session-logs/2024/out.txt",
    "s3://bucket/prefix/shard-00001.safetensors",
    "https://huggingface.co/org/model@main",  # an @ in the path is no user-info
    "git@github.com:org/repo.git",
    "user@example.com wrote",
    "the provided token has expired",
    "checkpoint step 5 of 10: 1.23 GB/s",
    "AKIA is a prefix; AKIASHORT is not a key",
    "--match 'torch.load'",
    "ckptbench: error: process 12 is not running (it exited, or the PID is wrong)",
]


@pytest.mark.parametrize("text,kept", LEAKS)
def test_a_credential_vanishes(text, kept):
    out = redact(text)
    assert S not in out, out
    assert kept in out, out


@pytest.mark.parametrize("key", KEY_IDS)
def test_aws_key_ids_vanish_wherever_they_are(key):
    for text in (key, f"id {key} here", f"--access-key-id={key}", f"s3 ({key})"):
        assert key not in redact(text)


@pytest.mark.parametrize("text", KEPT)
def test_ordinary_text_is_kept(text):
    assert redact(text) == text


@pytest.mark.parametrize("text,kept", LEAKS)
def test_redact_is_idempotent(text, kept):
    assert redact(redact(text)) == redact(text)


def test_author_and_tokenizer_lose_their_values_by_design():
    """Names containing a credential word are treated as one: predictable, and over-redaction is only cosmetic."""
    assert "Ada" not in redact("author=Ada")
    assert "/data/tok" not in redact("--tokenizer /data/tok")


@pytest.mark.parametrize("text,want", [
    ("run \x1b]0;pwned\x07id", "run id"),
    ("a\x1b[2Jb", "ab"),
    ("x\x1b[31;1mred\x1b[0m", "xred"),
    ("bell\x07 back\x08 nul\x00 del\x7f c1\x9b2J", "bell back nul del c12J"),
    ("tab\tand newline\nkept as spaces", "tab and newline kept as spaces"),
    ("ünïcödé → ok", "ünïcödé → ok"),
    ("model\u202eorsnetsafes.\u2066x\u2069", "modelorsnetsafes.x"),  # bidi overrides: shown out of order
])
def test_printable_strips_terminal_controls(text, want):
    assert printable(text) == want
