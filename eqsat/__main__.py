"""The text driver: ``python -m saturn.eqsat [options] GRAPH`` (see ``--help``)."""

from __future__ import annotations

import sys

from .driver import main

sys.exit(main())
