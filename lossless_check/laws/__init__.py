"""The laws of plain sampling: fixed-logits tables and scenarios, the stub models, warper stacks, the matrix of
cases, and the exact output laws that plain sampling has under them.

May import core and stats.
"""
