"""The domain's ground floor: the error family, units, repeat statistics, the concurrency bound, the stage names, the
live progress line, the options a user sets, the staging folder gen and save write into, JSON parsed as a
checkpoint's readers parse it. Imports nothing of ckptbench.

Other folders import only the modules named below (`from ckptbench.core import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["errors", "units", "stats", "concurrency", "stages", "progress", "paths", "verdicts", "options", "interrupt",
           "staging", "jsontext"]
