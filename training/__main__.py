"""`python -m training`: train, evaluate and export the shipped model
(training/simulator_run.py)."""

from training.simulator_run import main

raise SystemExit(main())
