"""The release history: ``sweep`` (a compat table over transformers releases, one environment per release) and
``bisect`` (the release where a verdict changes).

May import outputs and below.
"""
