"""The training loop, evaluation, checkpoints and the run summary."""
