"""Benchmarks for the Cairn router (not part of the installed package)."""
