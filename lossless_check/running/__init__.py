"""Running: how a run's work is spread and kept -- seeded chunks and looks, the process pool or Ray, the
journal and chunk store that resume uses, and progress. Knows nothing of what a trial is.

May import evidence and below.
"""
