"""``python -m hpcdl`` is the ``hpcdl`` command."""

import sys

from hpcdl.cli import main

sys.exit(main())
