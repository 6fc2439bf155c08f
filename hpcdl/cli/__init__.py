"""The ``hpcdl`` command line: one module per command group, and here the exit-code policy.
Bad input prints one line and exits with code 2.

``hpcdl --help`` and ``hpcdl COMMAND --help`` answer at once: the command's module is imported
only when the command is named (``COMMANDS``), and the modules import torch inside the handlers
that need it, not at their top (``tests/test_cli_imports.py`` keeps it so)."""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
from collections.abc import Iterable, Sequence

from hpcdl.cli.common import Parser, err
from hpcdl.cli.terminal import printable_output
from hpcdl.errors import HpcdlError, InputError, RunFailed
from hpcdl.parallel.launch import Terminated, end_with_launchers, stop_signals_raise
from hpcdl.parallel.world import end_all_ranks, rank_of_process, under_mpi

COMMANDS: dict[str, tuple[str, str]] = {
    # command: (its module in hpcdl/cli/, the line hpcdl --help shows: the module's own help=)
    "run": ("run", "measure the default suite, one workload, or a preset"),
    "sweep": ("sweep", "weak or strong scaling over rank counts, one record per point"),
    "capacity": ("capacity", "M independent instances of one workload at once (MLPerf HPC-style)"),
    "generate": ("workloads", "print a workload's size, FLOPs and memory without running it"),
    "info": ("workloads", "devices, peaks, and which optional parts are installed"),
    "io": ("workloads", "HDF5 write and read throughput of a workload's samples"),
    "list": ("workloads", "families and their knobs, presets, the default suite"),
    "comm": ("comm", "collective bandwidth sweeps (allreduce, all-gather, ...): the backend against raw MPI"),
    "submit": ("jobs", "submit a job file to a scheduler: one job per node count"),
    "status": ("jobs", "state of each submitted point: done, queued, running, failed and why"),
    "collect": ("jobs", "gather the valid records of a job's points into collected.json"),
    "rank": ("results", "verify records and write the ranking list (Markdown, HTML, CSV)"),
    "report": ("results", "HTML report with plots of records and sweeps, or the page of one diagnosis"),
    "predict": ("predict", "analytical scaling model: throughput and efficiency up to 4096 nodes"),
    "profile": ("proxy", "measure what one training step of a real model costs"),
    "fit": ("proxy", "fit an hpcdl workload to a profile; --verify times it against the model"),
    "system": ("submission", "a submission's system description: init from records, check"),
    "package": ("submission", "bundle results and a system description into NAME.tar.gz"),
    "check": ("submission", "verify a submission as a list maintainer: exit 1 on any problem"),
    "list-site": ("submission", "publish checked submissions as a static list site"),
    "diagnose": ("diagnose", "name the device, node or link below its peers; print an sbatch --exclude list"),
}


def build_parser(commands: Iterable[str] | None = None) -> Parser:
    """The ``hpcdl`` parser with the options of ``commands`` (every command when None): their
    modules are imported and add their parsers. Without any, the commands are only listed by
    name and help line, which is all that ``hpcdl --help`` prints."""
    p = Parser(prog="hpcdl", description="Benchmark a system on generated deep-learning training workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    chosen = list(COMMANDS) if commands is None else [c for c in commands if c in COMMANDS]
    modules = dict.fromkeys(COMMANDS[c][0] for c in chosen)  # in order, each once
    for name in modules:
        importlib.import_module(f"hpcdl.cli.{name}").add_parsers(sub)
    if not modules:
        for command, (_, line) in COMMANDS.items():
            sub.add_parser(command, help=line)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hpcdl`` command: 0 on success, 1 when a run completed but failed its checks, 2 on
    bad input (one line), 124 on a timeout, 130 on Ctrl-C, 143 on SIGTERM."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # what it prints never controls the terminal (a stranger's string); SIGTERM and SIGHUP unwind
    # it, so that what it made in temporary folders goes (a rank is ended by its launcher instead:
    # one blocked in MPI would not run a handler)
    stop = contextlib.nullcontext() if under_mpi() else stop_signals_raise()
    with printable_output(), stop:
        return _main(argv)


def _main(argv: list[str]) -> int:
    if under_mpi():  # a rank: mpirun started it, not hpcdl; it ends with hpcdl's launcher all the same
        end_with_launchers()
    try:
        return _command(argv)
    except RunFailed as e:  # found mid-run, maybe on one rank alone: end them all
        end_all_ranks(e, e.exit_code)
        err(f"hpcdl: error: {e}; nothing was recorded")
        return e.exit_code
    except HpcdlError as e:
        if rank_of_process() == 0 or getattr(e, "every_rank", False):  # the same bad input: say it once
            err(f"hpcdl: error: {e}")
        return e.exit_code
    except BrokenPipeError:  # output piped into `head`: not an error of the run
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:
        if _out_of_memory(e):
            err(f"hpcdl: error: out of device memory ({str(e).splitlines()[0]}); lower batch_size")
            return 2
        end_all_ranks(e)  # under MPI: name this rank, end every rank rather than let them hang
        raise
    except KeyboardInterrupt:
        err("hpcdl: interrupted; records already written are kept")
        return 130
    except Terminated as e:
        err(f"hpcdl: terminated ({e}); records already written are kept")
        return e.code


def _out_of_memory(e: Exception) -> bool:
    """torch's out-of-memory error, without importing torch: a command that never imported it
    cannot have run out of device memory."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(e, torch.OutOfMemoryError)


def _command(argv: list[str]) -> int:
    # the command is the first word: only its module is imported (plugins load when a family or
    # a backend is first looked up, e.g. to check --workload)
    named = argv[:1] if argv and not argv[0].startswith("-") else []
    parser = build_parser(named)
    args, extra = parser.parse_known_args(argv)
    # key=value words after options (``generate cnn --json layers=3``) are knobs too
    words = [w for w in extra if "=" in w and not w.startswith("-")]
    if len(words) < len(extra) or (words and not hasattr(args, "knobs")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if words:
        args.knobs = [*args.knobs, *words]
    args.argv = argv
    if isinstance(getattr(args, "np", None), int) and args.np < 1:
        raise InputError("np", args.np, "must be >= 1")
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise InputError("timeout", timeout, "a number of seconds > 0")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
