"""``python -m chorus.cli``: the ``chorus`` command of this checkout."""
import sys

from chorus.cli import main

sys.exit(main())
