"""Tasks that training and evaluation both use, so that neither imports the other: the needle in a haystack's
example generator and scorer (needle.py; docs/evaluation.md, "Needle in a haystack"). Imports nothing of the package.
"""
