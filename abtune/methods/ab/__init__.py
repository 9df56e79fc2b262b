"""AB-training: `settings.py` (its config section, searchable fields and phase schedule; torch-free) and
`method.py` (the Method: lowrank, layers, groups, sync beside it). Light on purpose: importing the
settings imports this package, and the configuration must load without torch."""
