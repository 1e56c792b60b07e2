"""``python -m posenc``."""

import sys

from posenc.cli import main

sys.exit(main())
