"""Runs on record: results.csv and its JSON documents, comparison against a baseline (and how one figure of it
reads: deltas), history.

Other folders import only the modules named below (`from ckptbench.records import X`, or names from one of them);
what is not named is this folder's own.
"""

__all__ = ["results", "recorder", "schema", "compare", "deltas", "history"]
