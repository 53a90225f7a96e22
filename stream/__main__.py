"""`python -m stream` is `fraud-scorer`."""

import sys

from stream.cli import main

sys.exit(main())
