"""Proxies of real models: measure what a model's training step costs (a *profile*), fit an
hpcdl workload that costs the same (a *fit*), and verify the two side by side.

* :mod:`~hpcdl.proxy.document` -- the profile document and its validation
* :mod:`~hpcdl.proxy.reference` -- a real model named by an import reference
* :mod:`~hpcdl.proxy.training` -- one training step of a real model or of a spec, the same way
* :mod:`~hpcdl.measure.kernels` (shared with runs) -- operator classes and the time and FLOP mix
* :mod:`~hpcdl.proxy.measure` -- measuring a profile
* :mod:`~hpcdl.proxy.structure` -- the network's layers from one hooked forward pass
* :mod:`~hpcdl.proxy.layout` -- a structure mapped onto a family's knobs
* :mod:`~hpcdl.proxy.space`, :mod:`~hpcdl.proxy.objective`, :mod:`~hpcdl.proxy.search` -- the fit
* :mod:`~hpcdl.proxy.result` -- what a fit returns (:class:`FitResult`) and its record
* :mod:`~hpcdl.proxy.verify` -- interleaved step-time comparison
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcdl.proxy.document import Profile, load
from hpcdl.proxy.measure import profile
from hpcdl.proxy.result import FitResult
from hpcdl.proxy.search import FitError
from hpcdl.proxy.search import fit as _fit


def as_profile(source: Profile | dict[str, Any] | str | Path) -> Profile:
    """A profile from itself, its JSON document, or the path of its file."""
    if isinstance(source, Profile):
        return source
    if isinstance(source, str | Path):
        source = load(Path(source))
    return Profile.from_dict(source)


def fit(
    profile: Profile | dict[str, Any] | str | Path, family: str | None = None, **options: Any
) -> FitResult:
    """Fit an hpcdl spec to a profile (a :class:`Profile`, its document or its file): the spec of
    ``family`` (default: of every family that takes the profile's data, the closest) whose
    parameters, FLOPs, memory, kernel mix and step time are nearest, with each figure's error.
    ``options`` are those of :func:`hpcdl.proxy.search.fit` (``weights``, ``seed``, ``budget_s``,
    ``finalists``, ``tolerance``, ``device``, ``memory_bytes``, ...).

    A miss is still an answer: when no spec reaches the tolerance the closest one is returned
    with its errors, ``result.reached`` False and ``result.miss`` saying which figures are off.
    Only invalid input raises (``InputError``), or :class:`FitError` when no candidate can be
    built here at all."""
    return _fit(as_profile(profile), family, **options)


__all__ = ["FitError", "FitResult", "Profile", "as_profile", "fit", "profile"]
