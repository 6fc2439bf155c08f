"""Data-parallel runs: ranks (MPI processes), gradient-reduction backends, launching."""
