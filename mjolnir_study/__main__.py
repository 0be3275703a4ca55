"""``python -m mjolnir_study study [...]``: the same command as the ``mjolnir`` console script."""

import sys

from .cli import main

sys.exit(main())
