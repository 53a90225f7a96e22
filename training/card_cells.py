"""How numbers are written in the model card's tables, the same in every section.

The card's sections (training/card.py and the table modules beside it) share these, so that a
share or a mean ± standard deviation reads alike wherever it appears.
"""

from __future__ import annotations

import math


def percent(value: float) -> str:
    """A share as a percentage with one decimal; n/a for NaN."""
    return "n/a" if math.isnan(value) else f"{100.0 * value:.1f} %"


def mean_std_cell(values: tuple[float, float]) -> str:
    """A mean and its standard deviation, or the mean alone when there is none."""
    mean, std = values
    return f"{mean:.3f}" if math.isnan(std) else f"{mean:.3f} ± {std:.3f}"
