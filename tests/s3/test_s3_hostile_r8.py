"""A hostile S3 endpoint, eighth round: the ETag a listing gives each object. It goes back to the server as If-Match on
every GET and is held against the bytes as S3's MD5; an odd one was refused only by the HTTP client, per file, in its
words (or read by awscrt as a 404 "missing"), and an opaque one failed a sound object as corrupt."""

from __future__ import annotations

from urllib.parse import quote
from xml.sax.saxutils import escape

import pytest
from s3help import one_line_error, run_cli
import s3hostile
from s3hostile import no_credentials

import ckptbench.cli.run  # noqa: F401  (imported before any per-test stream redirection)


def _listing_with_etag(objects: dict[str, bytes], etag: str) -> bytes:
    items = "".join(f"<Contents><Key>{quote(k, safe='/')}</Key><Size>{len(v)}</Size><ETag>{escape(etag)}</ETag>"
                    "</Contents>" for k, v in objects.items())
    return ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><EncodingType>url</EncodingType>'
            f"<IsTruncated>false</IsTruncated>{items}</ListBucketResult>").encode()


@pytest.mark.parametrize("etag", ['"a\r\nX-Injected: 1"', '"\u00e9t\u00e9"', '"' + "a" * 5000 + '"', '"""x"""',
                                  '"two words"', '"tab\there"'],
                         ids=["crlf", "non-ascii", "5000-chars", "quotes", "space", "tab"])
@pytest.mark.parametrize("client", ["threads", "crt"])
def test_an_etag_that_is_no_entity_tag_is_one_line(hostile, etag, client):
    """Before: a CR LF failed the file with botocore's "Invalid header value" (awscrt's AWS_ERROR_HTTP_INVALID_HEADER_VALUE),
    a non-ASCII one read as "missing" (404) under awscrt, 5000 characters as HTTP 431, each file by file after its
    retries. Now the listing is refused in one line naming the object, before any GET carries it."""
    hostile.pages = lambda n: _listing_with_etag(hostile.objects, etag)
    rc, out, err = run_cli("read", "s3://b/ck", "--s3-client", client)
    line = one_line_error(rc, err, "s3://b/ck", "ck/a.bin", "ETag", "not an HTTP entity tag")
    assert "\r" not in line and "X-Injected: 1\n" not in err and len(line) < 600
    assert not hostile.gets("ck/a.bin")  # no GET was sent with it
    no_credentials(out, err)


@pytest.mark.parametrize("etag", ['"' + "z" * 32 + '"', '"opaque-tag-v1"', "0123456789abcdef-x"],
                         ids=["32-letters", "opaque", "unquoted"])
def test_an_opaque_etag_is_no_checksum(hostile, etag):
    """An S3-compatible server's opaque tag of 32 letters was compared as S3's MD5: a sound object failed as
    "checksum_mismatch ... the object or the transfer is corrupt". Only an ETag written as an MD5 (32 hex digits,
    "-N" after them for N parts) is one; the others still guard the GETs (If-Match), and are not compared."""
    hostile.pages = lambda n: _listing_with_etag(hostile.objects, etag)
    rc, out, err = run_cli("read", "s3://b/ck", "--hash", "md5")
    assert rc == 0 and "checksum" not in err and "Traceback" not in err, err
    assert all(h.get("If-Match") == f'"{etag.strip(chr(34))}"' for h in hostile.gets("ck/a.bin"))


def test_an_md5_etag_in_upper_case_still_verifies(hostile):
    import hashlib

    md5 = hashlib.md5(hostile.objects["ck/a.bin"]).hexdigest().upper()
    hostile.pages = lambda n: _listing_with_etag(hostile.objects, f'"{md5}"')
    rc, out, err = run_cli("read", "s3://b/ck", "--hash", "md5", "--json")
    assert rc == 0, err
    import json

    assert json.loads(out)["files"][0]["digest"] == md5.lower()
    # and a wrong MD5 still fails the file: the check is kept where the tag is one
    hostile.pages = lambda n: _listing_with_etag(hostile.objects, '"' + "0" * 32 + '"')
    rc, out, err = run_cli("read", "s3://b/ck", "--hash", "md5")
    assert rc == 1 and "checksum" in err, err


@pytest.mark.parametrize("encryption", [{"x-amz-server-side-encryption": "aws:kms"},
                                        {"x-amz-server-side-encryption": "aws:kms:dsse"},
                                        {"x-amz-server-side-encryption-customer-algorithm": "AES256"}],
                         ids=["sse-kms", "dsse-kms", "sse-c"])
@pytest.mark.parametrize("client", ["threads", "crt"])
def test_an_etag_of_a_kms_or_customer_key_object_is_no_md5(hostile, encryption, client, monkeypatch):
    """S3 gives an object encrypted with a KMS key or the customer's an ETag of 32 hex digits that is not the MD5 of
    its bytes: held to it, a sound object read as corrupt under --hash md5. The GET's headers say so; S3-managed
    keys (AES256) keep the MD5 ETag, and a wrong one still fails."""
    data, encryption = hostile.objects["ck/a.bin"], dict(encryption)  # changed below: not the parameter's own
    hostile.pages = lambda n: _listing_with_etag(hostile.objects, '"' + "0" * 32 + '"')

    def headers():
        return {"ETag": '"' + "0" * 32 + '"', "Content-Type": "application/octet-stream", **encryption}

    def get(h, key, rng):
        start, end = (int(x) for x in rng.split("=", 1)[1].split("-")) if rng else (0, len(data) - 1)
        h._answer(206 if rng else 200, headers(), data[start:min(end, len(data) - 1) + 1])

    hostile.get = get
    # awscrt asks for the object's head before its ranged GETs
    monkeypatch.setattr(s3hostile.Handler, "do_HEAD", lambda h: h._answer(200, headers(), data, head=True))
    rc, out, err = run_cli("read", "s3://b/ck", "--hash", "md5", "--s3-client", client)
    assert rc == 0 and "checksum" not in err and "Traceback" not in err, err
    sse_s3 = {"x-amz-server-side-encryption": "AES256"}
    encryption.clear()
    encryption.update(sse_s3)
    rc, out, err = run_cli("read", "s3://b/ck", "--hash", "md5", "--s3-client", client)
    assert rc == 1 and "checksum" in err, err
