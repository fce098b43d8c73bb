"""ckptbench: checkpoint-restore benchmark and live diagnosis for large-model training."""

__version__ = "0.1.0"
