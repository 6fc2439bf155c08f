"""Containers in job files: the ``[container]`` table, and how it wraps each rank's command.

Two runtimes, the two ways HPC sites run containers under Slurm:

- ``pyxis`` (enroot through Slurm's pyxis plugin): ``srun`` itself starts each rank inside the
  image (``--container-image``, ``--container-mounts``, ``--no-container-mount-home``); a
  ``--container-name`` lets every step of the job reuse the one imported image.
- ``apptainer``: each rank is ``apptainer exec [--nv|--rocm] --bind ... IMAGE python3 ...``,
  started by ``srun --mpi=pmix`` (Apptainer's "hybrid" model: Slurm's PMIx joins the ranks).

Either way the ranks start with ``srun`` (``launcher = "srun"``): pyxis exists only as srun
options, and an ``mpirun`` inside an image cannot start ranks on the other nodes. The job's
output directory is mounted at the same path, so records land where ``hpcdl status`` looks.
Variables of the job's ``[env]`` table and those named in ``env`` reach the ranks even where
the image sets its own value (pyxis ``--container-env``; Apptainer ``APPTAINERENV_NAME``).

GPU flag (Apptainer): none for a CPU job (``gpus_per_node = 0``); otherwise ``--nv``, or
``--rocm`` when ``gpu_vendor = "amd"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hpcdl.errors import SpecError
from hpcdl.workloads.knobs import Knobs, knob

RUNTIMES = ("", "pyxis", "apptainer")
# SRC:DST[:ro], both absolute; no ',' (pyxis and Apptainer separate mounts with it), no ':' in
# a path, no spaces or shell characters (they are written into a batch script)
MOUNT_RE = re.compile(r"(/[A-Za-z0-9_.@%+/=-]*):(/[A-Za-z0-9_.@%+/=-]*)(:ro)?")
IMAGE_RE = re.compile(r"[A-Za-z0-9_.:@%+/=#-]+")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PYTHON = "python3"  # the interpreter inside the image (containers/ installs hpcdl into it)


@dataclass(frozen=True, kw_only=True)
class ContainerOptions(Knobs):
    """The job file's ``[container]`` table: the image every rank runs in."""

    prefix: ClassVar[str] = "container"

    runtime: str = knob("", choices=RUNTIMES, doc="pyxis (srun --container-image) or apptainer ('': none)")
    image: str = knob(
        "", doc="pyxis: an image reference or .sqsh file; apptainer: a .sif path (or docker://...)"
    )
    mounts: tuple[str, ...] = knob((), doc='bind mounts "SRC:DST" or "SRC:DST:ro", absolute paths')
    env: tuple[str, ...] = knob((), doc="names of variables of the submitting environment to pass in")
    gpu_vendor: str = knob(
        "nvidia", choices=("nvidia", "amd"), doc="apptainer on GPU jobs: --nv (nvidia) or --rocm (amd)"
    )

    def check(self) -> None:
        if not self.runtime:
            return
        if not IMAGE_RE.fullmatch(self.image):
            raise SpecError(f"{self.prefix}.image", self.image, "an image path or reference without spaces")
        for m in self.mounts:
            if not MOUNT_RE.fullmatch(m):
                raise SpecError(
                    f"{self.prefix}.mounts",
                    m,
                    "SRC:DST or SRC:DST:ro, absolute paths of letters, digits, _.@%+=-",
                )
        for name in self.env:
            if not ENV_NAME_RE.fullmatch(name):
                raise SpecError(f"{self.prefix}.env", name, "variable names: letters, digits and '_'")
        if self.runtime == "apptainer" and is_path(self.image) and not Path(self.image).exists():
            raise SpecError(f"{self.prefix}.image", self.image, "no such file: build it first (containers/)")

    # --- what the batch script gets ----------------------------------------------------------
    def wrap(
        self, srun: list[str], args: list[str], *, name: str, output: str, gpus: int, env: list[str]
    ) -> list[str]:
        """The srun line that starts ``python3 ARGS`` in the image on every rank. ``srun``: the
        srun command and its options; ``name``: the point's; ``output``: its results directory;
        ``env``: names of variables to pass in."""
        python = [PYTHON, *args]  # the image's interpreter, not this machine's
        mounts = ",".join([f"{output}:{output}", *self.mounts])
        names = sorted({*env, *self.env})
        if self.runtime == "pyxis":
            pyxis = [
                f"--container-image={self.image_ref()}",
                f"--container-mounts={mounts}",
                "--no-container-mount-home",
                f"--container-name=hpcdl-{name}",
                *([f"--container-env={','.join(names)}"] if names else []),
            ]
            return [*srun, *pyxis, *python]
        flag = [] if gpus == 0 else ["--rocm" if self.gpu_vendor == "amd" else "--nv"]
        return [*srun, "apptainer", "exec", *flag, "--bind", mounts, self.image_ref(), *python]

    def export_lines(self, env: list[str]) -> list[str]:
        """Apptainer: shell lines that pass each named variable in with precedence over the
        image's own value (``APPTAINERENV_NAME``), where it is set."""
        if self.runtime != "apptainer":
            return []
        names = sorted({*env, *self.env})
        return [f'if [ -n "${{{n}+set}}" ]; then export APPTAINERENV_{n}="${n}"; fi' for n in names]

    def image_ref(self) -> str:
        """The image as the batch script names it: paths made absolute (jobs may start elsewhere)."""
        return (
            str(Path(self.image).resolve())
            if is_path(self.image) and self.runtime == "apptainer"
            else self.image
        )


def is_path(image: str) -> bool:
    """True for a file path, False for a reference (``docker://...``, ``oras://...``)."""
    return "://" not in image


def check_launcher(options: ContainerOptions, launcher: str) -> None:
    """A container's ranks start with srun (see the module's docstring)."""
    if options.runtime and launcher != "srun":
        raise SpecError(
            "job.launcher",
            launcher,
            f'"srun" with a {options.runtime} container (srun starts each rank inside the image)',
        )


__all__ = ["RUNTIMES", "ContainerOptions", "check_launcher"]
