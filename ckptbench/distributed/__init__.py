"""The same restore under torchrun: the group and its deadlines, what each rank reads (shares, dcp_items), one rank's
timed restore (rank), the barriers and reports (driver), rank 0's document (summary), the live lanes and the
recorded runs (history).

Other folders import only the modules named below (`from ckptbench.distributed import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["driver", "history", "summary", "shares", "live"]
