"""The faces users touch: the Python API (check, run, fuzz, check_models), the CLI, the pytest plugin, the gate,
fuzzing and the mutation catalog.

May import every layer below; nothing below imports it.
"""
