"""The foundation: the errors every layer raises, option parsing, and what the installed transformers has.

Imports nothing else of lossless_check.
"""
