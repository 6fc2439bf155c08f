"""Workloads: what is trained. Specs (validated knobs), the families that turn a spec into a
network and its analytic count, the FLOP definitions and their cross-check against PyTorch's
counter, and the recipes (presets, size classes) read from ``generators/``."""
