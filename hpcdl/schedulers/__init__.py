"""Job files on batch schedulers: one job per point of a node-count sweep.

- :mod:`~hpcdl.schedulers.jobfile`: the job file (``workload_table``: its ``[workload]``)
- :mod:`~hpcdl.schedulers.protocol`: what a scheduler is, and the registry of schedulers
- :mod:`~hpcdl.schedulers.builtin`: the built-in schedulers, ``slurm`` and ``local``
  (``sacct``: what Slurm says of its jobs)
- :mod:`~hpcdl.schedulers.point`: a sweep point, the unit every scheduler runs
- :mod:`~hpcdl.schedulers.entry`: inside a job, running the point
- :mod:`~hpcdl.schedulers.submit`, :mod:`~hpcdl.schedulers.status`,
  :mod:`~hpcdl.schedulers.collect`: the commands, the same for every scheduler
- :mod:`~hpcdl.schedulers.state`: the state file that links points to jobs
- :mod:`~hpcdl.schedulers.logs`: a failed job's reason, from its logs
"""
