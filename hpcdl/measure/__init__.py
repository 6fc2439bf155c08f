"""Measuring one workload on this process's device, as one rank among the others: run settings,
peaks, auto-fit, synthetic and HDF5 data, the timed training loop, telemetry and caps, what a
rank measured, the distributed correctness checks, and ``hpcdl diagnose``'s measurement. Above
``parallel`` (the world and backends it uses); ``harness`` drives it."""
