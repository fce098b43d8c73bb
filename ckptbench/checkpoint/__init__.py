"""What a checkpoint is: its manifest and profile, its layout, the files in it that point at others (pointers) and
the one checkpoint a resume loads (resume), its formats, packs and their members, confined paths, how a message
quotes a hostile value, the sample model and generator, verify.

Other folders import only the modules named below (`from ckptbench.checkpoint import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["manifest", "profiles", "layouts", "pointers", "resume", "formats", "packs", "members", "detect", "tree", "confine", "model", "generate", "verify", "quote", "shares"]
