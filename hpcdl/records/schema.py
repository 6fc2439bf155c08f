"""The names of hpcdl's JSON documents (each one's ``"schema"`` field), in one place.

Only ``hpcdl.result`` documents are measurements that may rank; the others index, summarise or
extrapolate them."""

from __future__ import annotations

RESULT = "hpcdl.result"
"""one run's record (docs/reference/record.md)"""
RESULT_VERSION = 3
"""the version of a result record's fields: 3, every field a run writes present and typed;
older versions are read through ``records.migrate``'s table, which lists them all"""
SUITE = "hpcdl.suite"
"""the index of the records of one suite run"""
SWEEP = "hpcdl.sweep"
"""the summary of a scaling sweep over rank counts"""
KNOB_SWEEP = "hpcdl.knob-sweep"
"""the summary of a sweep over one workload knob (``hpcdl sweep --knob``)"""
COMM = "hpcdl.comm"
"""a collective-communication sweep (``hpcdl comm -o``)"""
RANKING = "hpcdl.ranking"
"""a ranking list (``hpcdl rank``)"""
PREDICTION = "hpcdl.prediction"
"""the scaling model's extrapolation (``hpcdl predict -o``): never a measurement"""
JOBS = "hpcdl.jobs"
"""the state file of submitted scheduler jobs"""
POINT = "hpcdl.point"
"""one point of a job file, as its ranks read it (``OUTPUT/submitit/NAME.point.json``)"""
COLLECTED = "hpcdl.collected"
"""the records of a job file's points, gathered (``hpcdl collect``)"""
CAPS = "hpcdl.caps"
"""the summary of a sweep over power or clock caps (``hpcdl sweep --power-limit``)"""
REPEATS = "hpcdl.repeats"
"""the summary of a workload run several times (``hpcdl run --repeat``)"""
CAPACITY = "hpcdl.capacity"
"""the summary of concurrent instances (``hpcdl capacity``)"""

MANIFEST = "hpcdl.manifest"
"""the SHA-256 of every file of a submission (``hpcdl package``; docs/rules.md)"""
LIST = "hpcdl.list"
"""one list of a list site: a class version's systems and scores (``hpcdl list-site``)"""

NOT_RECORDS = (
    SUITE,
    SWEEP,
    KNOB_SWEEP,
    COMM,
    RANKING,
    JOBS,
    POINT,
    COLLECTED,
    CAPS,
    REPEATS,
    CAPACITY,
    MANIFEST,
    LIST,
)
"""documents that sit among records but are not records to rank or report one by one"""
PROFILE = "hpcdl.profile"
"""what one training step of a model costs (``hpcdl profile``; docs/metrics.md, "Profiles and fits")"""
PROFILE_VERSION = 1
FIT = "hpcdl.fit"
"""a fitted proxy: the spec, each figure's error, its verifications (``hpcdl fit``)"""
FIT_VERSION = 1
