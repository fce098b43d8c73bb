"""The arithmetic of a checkpoint shape, at scale, and in money.

Other folders import only the modules named below (`from ckptbench.plan import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["shape", "scale", "cost"]
