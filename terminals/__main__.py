"""`python -m terminals` = `fraud-features`."""

import sys

from terminals.cli import main

sys.exit(main())
