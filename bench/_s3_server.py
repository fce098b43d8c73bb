"""The S3 benchmark's server: local_s3 (moto behind ckptbench.testing.s3local's shaping proxy) in a child process, so the
server's threads do not share a GIL with the clients being measured; driven by one JSON command per line on stdin.

Run as `python bench/_s3_server.py BACKLOG` by Server, the parent's handle on it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading

from _harness import ROOT, child_env

BUCKET = "ckptbench-s3bench"
FAULT_RATE = 0.05
FAULT_SEED = 7


def serve(backlog: int) -> int:
    from ckptbench.testing import shaping
    from ckptbench.testing.s3local import local_s3

    # socketserver listens with a backlog of 5: 16 clients connecting at once overflow it, the kernel drops the
    # extra SYNs and those connections wait for the 1 s SYN retransmit. Real S3 does not do that, so the harness
    # raises the backlog (set before the proxy binds); --proxy-backlog 5 measures the server as it ships.
    shaping._ProxyServer.request_queue_size = backlog

    # Requests in flight at the proxy (accepted, response not yet finished): the most at once is the
    # concurrency a client really used, whatever its settings say. Counted around the proxy's per-request entry.
    flight = {"now": 0, "peak": 0}
    lock = threading.Lock()
    inner = shaping._Handler._proxy_one

    def counted(handler) -> None:
        with lock:
            flight["now"] += 1
            flight["peak"] = max(flight["peak"], flight["now"])
        try:
            inner(handler)
        finally:
            with lock:
                flight["now"] -= 1

    shaping._Handler._proxy_one = counted
    with local_s3(latency_s=0.0, bandwidth_bps=None, fault_rate=0.0, seed=FAULT_SEED) as s3:
        proxy = s3.proxy
        bucket = s3.make_bucket(BUCKET)
        print(json.dumps({"env": s3.env, "endpoint": s3.endpoint_url, "bucket": bucket}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            reply: dict = {"ok": True}
            if op == "shape":
                proxy.latency_s = cmd["latency_s"]
                proxy.bandwidth_bps = cmd["bandwidth_bps"] or None
                proxy.fault_kinds = tuple(cmd.get("fault_kinds", ("slowdown", "reset")))
                if "seed" in cmd:  # a fresh generator, so the fault phase draws the same sequence every run
                    proxy._rng = random.Random(cmd["seed"])
                proxy.fault_rate = cmd["fault_rate"]
            elif op == "counters":
                reply = proxy.counters()
            elif op == "peak":
                with lock:
                    reply = {"peak": flight["peak"], "now": flight["now"]}
                    flight["peak"] = flight["now"]
            elif op == "stop":
                print(json.dumps(reply), flush=True)
                break
            print(json.dumps(reply), flush=True)
    return 0


class Server:
    """The parent's handle on the server child."""

    def __init__(self, backlog: int = 128) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(backlog)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
        hello = json.loads(self.proc.stdout.readline())
        self.env, self.endpoint, self.bucket = hello["env"], hello["endpoint"], hello["bucket"]

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def shape(self, latency_s: float, bandwidth_bps: float | None, fault_rate: float = 0.0, **kw) -> None:
        self.ask(op="shape", latency_s=latency_s, bandwidth_bps=bandwidth_bps, fault_rate=fault_rate, **kw)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(op="stop")
                self.proc.wait(timeout=20)
            except (OSError, ValueError, subprocess.TimeoutExpired, json.JSONDecodeError):
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
