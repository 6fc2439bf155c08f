"""The workload families, one module each: its spec (knobs), network, analytic count and
sampling ranges side by side."""
