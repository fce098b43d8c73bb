"""The troubleshooting checklist: facts gathered once, rules over them, FUSE knowledge.

Other folders import only the modules named below (`from ckptbench.checklist import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["rules", "facts", "fuse", "efficiency"]
