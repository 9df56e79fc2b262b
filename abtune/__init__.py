"""abtune: find and scale hyperparameters for communication-efficient distributed training."""

__version__ = "0.1.0"
