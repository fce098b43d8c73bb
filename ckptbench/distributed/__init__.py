"""The same restore under torchrun: the group and its deadlines, one rank's timed restore of its share
(rank; what each rank reads is checkpoint/shares), the barriers and reports (driver), rank 0's document (summary), the
live lanes and the recorded runs (history).

Other folders import only the modules named below (`from ckptbench.distributed import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["driver", "group", "history", "summary", "live"]
