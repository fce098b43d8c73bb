"""The command line: the composition root that turns arguments into domain calls (main), and the handlers
it loads lazily (cmds, run, dist, save, watch)."""

from ckptbench.cli.root import main

__all__ = ["main"]
