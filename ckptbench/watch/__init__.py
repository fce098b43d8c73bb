"""A restore ckptbench did not start: sampled, its phases, a verdict, its record.

Other folders import only the modules named below (`from ckptbench.watch import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["sampler", "verdict", "results"]
