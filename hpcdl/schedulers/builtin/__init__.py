"""The built-in schedulers, one module each; every module here registers its scheduler when
imported (``hpcdl.schedulers.protocol.SCHEDULERS`` imports them all), so importing one must
be cheap and do nothing else: each imports submitit only when it submits."""
