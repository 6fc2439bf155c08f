"""The ``hpcdl`` command line: one module per command group, and here the exit-code policy.
Bad input prints one line and exits with code 2."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence

import torch

from hpcdl.cli import capacity, comm, jobs, predict, proxy, results, run, submission, sweep, workloads
from hpcdl.cli import diagnose as diagnose_cmd
from hpcdl.cli.common import Parser, err
from hpcdl.errors import HpcdlError, InputError, RunFailed
from hpcdl.parallel.world import end_all_ranks, rank_of_process


def build_parser() -> Parser:
    p = Parser(prog="hpcdl", description="Benchmark a system on generated deep-learning training workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (run, sweep, capacity, workloads, comm, jobs, results, predict, proxy, submission):
        group.add_parsers(sub)
    diagnose_cmd.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hpcdl`` command: 0 on success, 1 when a run completed but failed its checks, 2 on
    bad input (one line), 124 on a timeout, 130 on Ctrl-C, 143 on SIGTERM."""
    argv = list(sys.argv[1:] if argv is None else argv)
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
    except torch.OutOfMemoryError as e:  # before Exception, which it is one of
        err(f"hpcdl: error: out of device memory ({str(e).splitlines()[0]}); lower batch_size")
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error of the run
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:
        end_all_ranks(e)  # under MPI: name this rank, end every rank rather than let them hang
        raise
    except KeyboardInterrupt:
        err("hpcdl: interrupted; records already written are kept")
        return 130


def _command(argv: list[str]) -> int:
    parser = build_parser()  # plugins load here: their families and backends become choices
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
