"""Opt-in training-runtime components for mmengine runs (see README)."""
