"""Shared fixtures for the S3 tests: one shaped local S3 per session, and a factory for faulty ones.

moto keeps buckets in process-global state, so every server started in this process sees the same buckets:
take a fresh one from `s3server.make_bucket()` (no name: a unique one) or the `s3bucket` fixture.
"""

from __future__ import annotations

import contextlib

import pytest
import s3hostile

from ckptbench.testing.s3local import local_s3

@pytest.fixture(scope="session")
def s3server():
    """moto behind the shaping proxy: 20 ms first-byte latency, no bandwidth cap, no faults."""
    with local_s3(latency_s=0.02) as s3:
        yield s3


@pytest.fixture
def s3bucket(s3server) -> str:
    """A fresh, empty bucket on the session server."""
    return s3server.make_bucket()


@pytest.fixture
def s3faulty():
    """Factory: s3faulty(fault_rate=1.0, fault_kinds=(...), seed=0, latency_s=0.0, bandwidth_bps=None,
    reset_points=("before", "mid")) starts a local S3 that is stopped when the test ends."""
    with contextlib.ExitStack() as stack:
        def make(fault_rate: float = 1.0, fault_kinds=("slowdown", "reset"), seed: int | None = 0,
                 latency_s: float = 0.0, bandwidth_bps: float | None = None, reset_points=("before", "mid")):
            s3 = stack.enter_context(local_s3(latency_s=latency_s, bandwidth_bps=bandwidth_bps,
                                              fault_rate=fault_rate, fault_kinds=fault_kinds, seed=seed))
            s3.proxy.reset_points = tuple(reset_points)
            return s3

        yield make


@pytest.fixture
def s3env(s3server, monkeypatch):
    """This process's environment pointed at the session server (what the CLI reads credentials from)."""
    for k, v in s3server.env.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_RETRY_MODE"):
        monkeypatch.delenv(k, raising=False)
    return s3server.env


@pytest.fixture
def hostile(monkeypatch):
    """A crafted endpoint on 127.0.0.1 (s3hostile.Hostile), named in the environment with credentials that no output
    may hold."""
    yield from s3hostile.serve(monkeypatch)
