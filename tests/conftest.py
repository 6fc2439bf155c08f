"""Shared test settings."""

import torch

# One intra-op thread: the test models are tiny, and on a busy 2-core machine OpenMP's
# spinning threads made them up to 20x slower. Subprocesses (CLI, MPI ranks) set their own.
torch.set_num_threads(1)
