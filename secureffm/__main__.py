"""``python -m secureffm``: the same command as ``secureffm``."""

import sys

from .cli import main

sys.exit(main())
