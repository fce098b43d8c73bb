"""The floor through an S3 source: `ckptbench floor s3://...` measures the link with the source's own client, a run
then names the network as what binds, and the figures are cached per endpoint without a credential; the proxy's
link cap is shared by every connection, as a real link's capacity is.

What is asserted on time, and why: the local S3 sits behind a proxy whose link cap (LINK bytes/s over all
connections) is far below what moto, the proxy and the reader can move on this box, so the link is what a read
sees. The network figure and the run's read rate are then within 15 % of LINK, and the floor within 15 % of
bytes ÷ LINK (a request's 20 ms first byte costs a few percent). A restore also lists, parses and checks its
checkpoint, so its efficiency (floor ÷ RTO) is asserted only to be sane (0.5..1.15), not near 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from s3help import put_dir

from ckptbench.testing.s3local import local_s3

MiB = 1 << 20
LINK = 40e6  # bytes/s: a ~70 MiB checkpoint takes about 2 s through it


@pytest.fixture(scope="module")
def linked():
    """moto behind a proxy with a 40 MB/s link shared by all connections and no per-connection cap."""
    with local_s3(latency_s=0.02, link_bps=LINK) as s3:
        yield s3


@pytest.fixture(scope="module")
def remote(linked, tmp_path_factory) -> str:
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("floor") / "ck"
    generate(profiles.load("small").scaled(0.3), str(root), force=True)  # over the 64 MiB a figure needs
    bucket = linked.make_bucket()
    put_dir(linked.client(direct=True), bucket, "ck", str(root))
    return f"s3://{bucket}/ck"


def cli(env: dict, *args) -> subprocess.CompletedProcess:
    """The CLI in its own process: the reader then competes with the server for no interpreter lock."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | env
    return subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], env=full, capture_output=True,
                          text=True, timeout=300)


def test_the_link_cap_is_shared_by_every_connection(s3faulty):
    s3 = s3faulty(fault_rate=0.0)
    s3.proxy.link_bps = 8 * MiB
    bucket = s3.make_bucket()
    data = os.urandom(4 * MiB)  # half a second at the cap: connection set-up and latency are small beside it
    s3.client(direct=True).put_object(Bucket=bucket, Key="blob", Body=data)
    clients = [s3.client(), s3.client()]  # two clients: two connections
    for c in clients:  # each connection opened before the clocks, so the single GET does not time a set-up
        c.head_object(Bucket=bucket, Key="blob")

    def timed_get(client) -> float:
        start = time.monotonic()
        assert client.get_object(Bucket=bucket, Key="blob")["Body"].read() == data
        return time.monotonic() - start

    one = timed_get(clients[0])
    start = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(timed_get, clients))
    both = time.monotonic() - start
    assert both >= 1.6 * one  # twice the bytes through one link: about twice as long, not the same time


def test_floor_through_s3_then_a_run_bound_by_the_network(linked, remote, tmp_path):
    env = linked.env | {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = cli(env, "sysinfo", remote, "--json")
    assert r.returncode == 0, r.stderr
    assert "not measured" in json.loads(r.stdout)["floor"]["storage"]  # sysinfo never measures
    r = cli(env, "check", remote, "--json")
    assert r.returncode in (0, 1), r.stderr
    item = json.loads(r.stdout)["items"][-1]  # no figure yet: check says how to get one, and does not sweep
    assert item["id"] == "efficiency" and item["verdict"] == "unknown", item
    assert f"`ckptbench floor {remote}`" in item["fix"]

    r = cli(env, "floor", remote, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    bucket = remote.split("/")[2]
    assert doc["resource"] == "network" and doc["mount"].endswith(f"/{bucket} (s3)"), doc  # per endpoint and bucket
    assert not [n for n in doc["notes"] if "latency" in n]  # 70 MiB is a bandwidth figure
    assert doc["storage"]["gbps"] * 1e9 == pytest.approx(LINK, rel=0.15), doc["storage"]
    assert "(--s3-client threads)" in doc["storage"]["method"]  # the client that measured it
    assert doc["restore"]["binding"] == "network"
    assert doc["restore"]["floor_s"] == pytest.approx(doc["restore"]["bytes"] / LINK, rel=0.15)

    r = cli(env, "run", remote, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["binding"] == "network" and run["binding_gbps"] == doc["storage"]["gbps"], run["floor_note"]
    assert run["floor_s"] == pytest.approx(run["bytes"] / LINK, rel=0.15)
    assert 0.5 <= run["efficiency"] <= 1.15, (run["efficiency"], run["rto_s"])

    r = cli(env, "check", remote, "--json", "--concurrency", "16")
    assert r.returncode in (0, 1), r.stderr
    ev = json.loads(r.stdout)["items"][-1]["evidence"]  # the cached figure, the floor's sample read once
    assert ev["binding"] == "network" and ev["floor_cached"] is True and ev["read"] == "ranged GET", ev
    assert ev["ceilings"]["network"]["gbps"] == round(doc["storage"]["gbps"], 3) and ev["sample_bytes"] > 0
    assert ev["measured_gbps"] * 1e9 == pytest.approx(LINK, rel=0.2) and 0.5 <= ev["efficiency"] <= 1.2, ev

    r = cli(env, "sysinfo", remote)
    assert r.returncode == 0 and "floor network" in r.stdout and "GB/s for" in r.stdout, r.stdout

    r = cli(env, "floor", remote)  # the second time: from the cache, no new sweep
    assert r.returncode == 0 and "(cached figures)" in r.stdout and "bound by network" in r.stdout, r.stdout
    assert "measured with --s3-client" not in r.stdout
    r = cli(env, "floor", remote, "--s3-client", "crt", "--json")  # the cached figure is the threads client's: said
    assert r.returncode == 0, r.stderr
    assert any("measured with --s3-client threads" in n and "--s3-client crt --remeasure" in n
               for n in json.loads(r.stdout)["notes"]), r.stdout
    cache = (tmp_path / "cache" / "ckptbench" / "floor.json").read_text()
    for secret in (linked.env["AWS_SECRET_ACCESS_KEY"], linked.env["AWS_ACCESS_KEY_ID"]):
        assert secret not in cache and secret not in r.stdout + r.stderr
