"""``python -m fedroute``: the ``fedroute`` command line (:mod:`fedroute.cli`)."""

import sys

from fedroute.cli import main

sys.exit(main())
