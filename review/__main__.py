"""`python -m review`: the same as `fraud-review`."""

from review.cli import main

raise SystemExit(main())
