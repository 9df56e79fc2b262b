"""Sparse Binary Compression: `settings.py` (torch-free) and `method.py` (with compress and golomb beside it).
Light on purpose: the configuration imports the settings without torch."""
