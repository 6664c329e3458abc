"""``python -m fedroute.cli``: the ``fedroute`` command line."""

import sys

from fedroute.cli import main

sys.exit(main())
