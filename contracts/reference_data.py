"""The reference data the features read: each country's currencies, the merchant-category
families, the high-risk merchant countries. One place, each with its source (docs/features.md,
Reference data).

- `COUNTRY_CURRENCIES`: every ISO 3166 country's legal-tender currencies (ISO 4217), from the
  Unicode CLDR (`contracts/country_currencies.py`, generated with babel). A card whose billing
  currency is none of the merchant country's is cross-border; a country with two (Panama: PAB
  and USD; Bulgaria in 2026: BGN and EUR) accepts either.
- `MCC_FAMILIES`: merchant category codes (ISO 18245) by risk family. Travel is the generic
  travel codes and ISO 18245's range 3000-3999, which the card networks assign to individual
  airlines, car-rental companies and hotels; the other families are the named codes card-fraud
  reports single out (`MCC_FAMILY_CODES`). Every named code and the range are checked against
  the ISO 18245 list of the `iso18245` package (a test). A code in no family belongs to none.
- `HIGH_RISK_COUNTRIES`: merchant countries that card-fraud reports rank high for
  card-not-present fraud; a curated list, to be set by each team.
"""

from __future__ import annotations

from contracts.country_currencies import COUNTRY_CURRENCIES

__all__ = [
    "COUNTRY_CURRENCIES",
    "HIGH_RISK_COUNTRIES",
    "MCC_FAMILIES",
    "MCC_FAMILY_CODES",
    "MCC_FAMILY_RANGES",
]

#: Merchant countries that card-fraud reports rank high for card-not-present fraud.
HIGH_RISK_COUNTRIES: frozenset[str] = frozenset({"NG", "RU", "UA", "RO", "ID", "PH"})

#: The named codes of each family (what the simulator draws its merchants from).
MCC_FAMILY_CODES: dict[str, tuple[int, ...]] = {
    "everyday": (5311, 5411, 5499, 5541, 5542, 5812, 5814, 5912),
    "travel": (3000, 3001, 3005, 3501, 3502, 4111, 4121, 4511, 7011, 7512),
    "digital": (4816, 5815, 5816, 5817, 5818, 5967),
    "high_value": (5045, 5094, 5732, 5944),
    "cash": (4829, 6010, 6011, 6051, 7995),
}
#: ISO 18245 ranges (inclusive) that belong to a family whole: the codes of individual airlines,
#: car-rental companies and hotels.
MCC_FAMILY_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "travel": ((3000, 3999),),
}
#: Every code of each family: its named codes and its ranges.
MCC_FAMILIES: dict[str, tuple[int, ...]] = {
    family: tuple(
        sorted(
            set(codes).union(
                *(range(low, high + 1) for low, high in MCC_FAMILY_RANGES.get(family, ()))
            )
        )
    )
    for family, codes in MCC_FAMILY_CODES.items()
}
