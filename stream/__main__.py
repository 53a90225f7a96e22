"""`python -m stream` is `fraud-scorer`."""

import sys

from stream.startup.cli import main

sys.exit(main())
