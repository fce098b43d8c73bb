"""What the box is and does: /proc and /sys probes (failing soft), the page cache (cold/hot verified), the read path,
live system figures, FUSE daemons, GPU memory, writeback, the environment a run is recorded with, storage presets,
and the floor (what the box can do for a restore or a save, and what binds it, said one way: binding).

Other folders import only the modules named below (`from ckptbench.system import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["probes", "procstat", "env", "pagecache", "readmode", "live", "fuse", "gpustat", "writeback", "storage",
           "floor", "writefloor", "binding"]
