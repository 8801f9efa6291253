"""Offline bundles: everything a cluster would download, in one checked piece."""
