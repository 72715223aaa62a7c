"""Tier tests/experiments: the training programs of experiments/ (run from a checkout; not in the wheel)."""
