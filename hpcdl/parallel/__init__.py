"""Several ranks: who this process is (the MPI world), starting ranks (the one mpirun
builder), gradient-reduction backends, correctness checks and the collective microbenchmarks."""
