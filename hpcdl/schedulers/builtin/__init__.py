"""The built-in schedulers, one module each; every module here registers its scheduler when
imported (``hpcdl.schedulers.protocol.SCHEDULERS`` imports them all), so importing one must
be cheap and do nothing else: each imports submitit only when it submits."""

from __future__ import annotations

import importlib.util


def submitit_missing() -> str:
    """'' when submitit can be imported, else how to install it (both built-ins use it)."""
    return "" if importlib.util.find_spec("submitit") else "needs submitit: pip install 'hpcdl[slurm]'"
