"""Place names of GPS positions, offline: the nearest populated place (GeoNames cities of 1,000+
people, shipped inside the `reverse_geocode` package; no network) and its region and country.
Receives (lat, lon) from `photo_metadata`; hands back the city/region/country fields.

Why `reverse_geocode` (richardpenman, releases through 2025, data in the wheel, numpy+scipy KD-tree)
over `reverse_geocoder` (thampiman, last release 2016, multiprocessing start-up): it is kept up, has
the region ("state") in its records, and loads its 3 MB table once in about a second.
"""

from __future__ import annotations

import math
from typing import Any

PHOTOS_EXTRA = "pip install 'faste-mm[photos]'"


def place_of(lat: float, lon: float, issues: list[str]) -> dict[str, Any]:
    """{"city", "region", "country"} of the populated place nearest (lat, lon) (the keys known);
    {} with an issue appended when the geocoder is not installed or the position is not finite."""
    if not (math.isfinite(lat) and math.isfinite(lon)):
        issues.append("gps out of range")
        return {}
    try:
        import reverse_geocode
    except ImportError:
        issues.append(f"place skipped (reverse_geocode missing: {PHOTOS_EXTRA})")
        return {}
    found = reverse_geocode.get((lat, lon))
    names = {"city": found.get("city"), "region": found.get("state") or found.get("county"),
             "country": found.get("country")}
    return {key: value for key, value in names.items() if isinstance(value, str) and value}
