"""A local S3 endpoint for tests, benchmarks and `make demo-s3`: moto's server behind a shaping proxy (shaping.py,
which adds S3's first-byte latency, bandwidth caps and faults).

Everything binds to 127.0.0.1; nothing here touches os.environ (only an unconfigured werkzeug logger is quieted).
moto keeps buckets in process-global backends: servers in one process share buckets, so use distinct names.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import secrets
import threading

from ckptbench.testing.shaping import HOST, ShapingProxy


def start_moto():
    """Start moto's threaded server on 127.0.0.1 and a kernel-chosen free port; stop it with server.stop().

    moto is the `s3-demo` extra (and a test dependency), imported only here."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO through its own handler unless told otherwise; quiet it only when
    # nobody has configured that logger, so benchmark and demo output stay readable.
    wz = logging.getLogger("werkzeug")
    if wz.level == logging.NOTSET:
        wz.setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)  # werkzeug binds port 0 and records it
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


class LocalS3:
    """A running moto + proxy pair; made by local_s3()."""

    def __init__(self, moto_server, direct_url: str, proxy: ShapingProxy) -> None:  # moto.server.ThreadedMotoServer
        self.moto_server = moto_server
        self.direct_url = direct_url
        self.proxy = proxy
        self.endpoint_url = proxy.url
        self._direct = None
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": "testing-key-id",
            "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(24),  # random per server, so leaks are detectable
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, direct: bool = False, **config):
        """A boto3 S3 client against the proxy (or moto itself with direct=True); config goes to botocore Config,
        e.g. retries={"mode": "standard", "max_attempts": 1}."""
        import boto3  # here, not at module top: the servers alone need only moto
        from botocore.config import Config

        cfg = Config(s3={"addressing_style": "path"}, **config)
        return boto3.session.Session().client(
            "s3", endpoint_url=self.direct_url if direct else self.endpoint_url, region_name=self.env["AWS_REGION"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"], config=cfg)

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name if none is given: moto's buckets are shared process-wide) through
        moto directly, so set-up neither waits on nor trips over the shaping. Returns the name."""
        name = name or f"ckptbench-{secrets.token_hex(6)}"
        if self._direct is None:  # boto3 clients are thread-safe and slow to build: make this one once
            self._direct = self.client(direct=True)
        self._direct.create_bucket(Bucket=name)
        return name


@contextlib.contextmanager
def local_s3(latency_s: float = 0.020, bandwidth_bps: float | None = None, fault_rate: float = 0.0,
             fault_kinds: tuple[str, ...] = ("slowdown", "reset"), seed: int | None = None,
             link_bps: float | None = None):
    """Start moto and a ShapingProxy in front of it; yield a LocalS3; stop both on exit."""
    moto_server, direct_url = start_moto()
    try:
        proxy = ShapingProxy(direct_url, latency_s=latency_s, bandwidth_bps=bandwidth_bps, fault_rate=fault_rate,
                             fault_kinds=fault_kinds, seed=seed, link_bps=link_bps)
        proxy.start()
        try:
            yield LocalS3(moto_server, direct_url, proxy)
        finally:
            proxy.stop()
    finally:
        moto_server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptbench.testing.s3local",
                                     description="Serve a local S3 (moto) behind a latency/bandwidth/fault proxy.")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency per request")
    parser.add_argument("--bandwidth-mbps", type=float, default=0.0,
                        help="per-connection cap in megabits/s (0 = unlimited)")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests given a fault, 0..1")
    parser.add_argument("--seconds", type=float, help="stop after this long (default: until Ctrl-C)")
    args = parser.parse_args(argv)
    bandwidth = args.bandwidth_mbps * 1e6 / 8 if args.bandwidth_mbps > 0 else None
    with local_s3(latency_s=args.latency_ms / 1000, bandwidth_bps=bandwidth, fault_rate=args.fault_rate) as s3:
        print(f"S3 endpoint (shaped): {s3.endpoint_url}   moto direct: {s3.direct_url}\nexport in the client's shell:")
        print("\n".join(f"export {key}={value}" for key, value in s3.env.items()))
        print("serving; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait(args.seconds)  # None: until Ctrl-C
        print(f"counters: {s3.proxy.counters()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
