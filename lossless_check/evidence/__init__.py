"""The evidence: case results, the analysis of observations into p-values and TV figures, and the attribution
of an exact failure to its cause (generator or verifier).

May import subjects, laws, stats and core.
"""
