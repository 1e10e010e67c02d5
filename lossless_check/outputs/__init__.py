"""The outputs: the run report (table, JSON, HTML, plots), the verifier's report, listings, and standalone
reproduction scripts (from the data file repro_template.py.tmpl).

May import modes and below.
"""
