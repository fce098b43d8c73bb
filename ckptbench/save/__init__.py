"""The write side: a series of atomic saves, timed, with preflight, analysis and their record.

Other folders import only the modules named below (`from ckptbench.save import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["series", "report", "write", "state", "analysis", "results", "preflight"]
