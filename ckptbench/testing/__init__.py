"""A local S3 server for tests, benchmarks and the S3 demo: moto (s3local) behind a proxy that shapes it like S3
(shaping).

Other folders import only the modules named below (`from ckptbench.testing import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["s3local", "shaping"]
