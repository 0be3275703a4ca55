"""``python -m mjolnir_study study [...]``: the same command as the ``mjolnir`` console script."""

import sys

from .cli import main

if __name__ == "__main__":  # not when a spawned end-to-end worker re-imports the main module
    sys.exit(main())
