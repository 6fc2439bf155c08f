"""Debian's headless Chromium, as the browser tests drive it (scripts/setup.sh --test installs
it): the flags that let it run as root in CI, and one call that runs it."""

from __future__ import annotations

import shutil
import subprocess

CHROMIUM = [
    "--headless=new",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-background-networking",  # the pages under test load nothing from elsewhere
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
]


def browse(*args: str) -> subprocess.CompletedProcess[str]:
    """Chromium with ``CHROMIUM`` and ``args`` (a URL last); its stderr holds the pages' console."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed: bash scripts/setup.sh --test installs it"
    return subprocess.run([chromium, *CHROMIUM, *args], capture_output=True, text=True, timeout=120)
