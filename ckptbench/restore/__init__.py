"""The restore as timed stages (runner), loading and checking (load, scan), the device stage, and what drives it:
sessions, sweeps, loops, auto-tune, inspect, plain reads, warm-up.

Other folders import only the modules named below (`from ckptbench.restore import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["runner", "stages", "load", "scan", "device", "session", "sweep", "loop", "autotune", "inspect", "reading",
           "efficiency",
           "warmup", "resources"]
