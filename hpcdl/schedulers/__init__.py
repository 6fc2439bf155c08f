"""Batch schedulers: job files, and submitting, following and collecting sweeps of jobs."""
