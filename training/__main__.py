"""`python -m training`: train, evaluate and export the shipped model (see training/train.py)."""

from training.train import main

raise SystemExit(main())
