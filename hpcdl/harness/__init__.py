"""The harness: drives the stages below it. ``runner`` takes one workload from preflight through
the timed loop on every rank (``measure``, ``parallel``) to its written record (``records``);
``capacity`` runs several instances of it in one MPI job, alone and together."""
