"""Several ranks: who this process is (the MPI world), starting ranks (the one mpirun builder),
gradient-reduction backends and their collectives, where parameters live, and the collective
microbenchmarks. Below ``measure``: the timed loop calls the communication layer, never back."""
