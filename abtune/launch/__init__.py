"""Launchers: how the ranks of a run are started (local processes now; submitit/SLURM later)."""
