"""Capacity before placement: what a model needs, read from its files' headers, and where it fits."""
