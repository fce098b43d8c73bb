"""A local S3 server (moto behind a shaping proxy) for tests, benchmarks and the S3 demo.

Other folders import only the modules named below (`from ckptbench.testing import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["s3local"]
