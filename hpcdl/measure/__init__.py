"""Measuring one workload on this process's device: run settings, the device and its peaks,
synthetic and HDF5 data, the timed training loop, telemetry, and the runner that ties them."""
