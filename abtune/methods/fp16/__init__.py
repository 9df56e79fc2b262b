"""fp16 compression: `settings.py` (torch-free) and `method.py`. Light on purpose: the configuration
imports the settings without torch."""
