"""Who may reach the server.

- Binding anything but loopback needs an API key or an explicit --insecure, so a model server
  is never opened to a network by accident (`check_bind`).
- Only requests that name this server in their Host header are answered (`is_allowed_host`):
  a web page whose name an attacker re-points at 127.0.0.1 (DNS rebinding) sends its own name,
  and would otherwise read search results and thumbnails through the victim's browser.
- A cross-site form or fetch POST (which a browser sends without asking the server first) is
  refused unless the server checks an API key, which such a request cannot carry (`is_cross_site`).
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from faste_mm.errors import ConfigError

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
# The names a loopback server always answers to (besides --host and --allowed-host).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"  # --allowed-host '*': answer every Host (behind a proxy that checks it itself)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; 0.0.0.0 / :: (every interface) are not."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, api_key: str | None, insecure: bool) -> None:
    """ConfigError when `host` is not loopback and neither an API key nor `insecure` is given."""
    if is_loopback(host) or api_key or insecure:
        return
    raise ConfigError(f"--host {host} would let other machines reach this server without authentication; "
                      f"give --api-key KEY (clients send 'Authorization: Bearer KEY'), or --insecure if this "
                      f"network is trusted, or bind 127.0.0.1")


def normalize_host(name: str) -> str:
    """A host name as compared: lower case, no IPv6 brackets, no trailing dot."""
    return name.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def host_names(bind_host: str, allowed: Iterable[str] = ()) -> tuple[str, ...]:
    """The Host names a server bound to `bind_host` answers: loopback, the bound address, and
    the `--allowed-host` names (sorted, normalised, without repeats)."""
    return tuple(sorted({*LOOPBACK_HOSTS, normalize_host(bind_host), *(normalize_host(a) for a in allowed)}))


def request_host(header: str) -> str:
    """The host name of a Host (or Origin netloc) value: "[::1]:8000" -> "::1", "a.lan:80" -> "a.lan"."""
    value = header.strip()
    if value.startswith("["):
        return normalize_host(value[: value.find("]") + 1])
    return normalize_host(value.rsplit(":", 1)[0] if value.count(":") == 1 else value)


def is_allowed_host(header: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request's Host header names this server (`ANY_HOST` allows every name)."""
    allowed = tuple(allowed)
    return ANY_HOST in allowed or (header is not None and request_host(header) in allowed)


def is_cross_site(headers: Mapping[str, str], allowed: Iterable[str]) -> bool:
    """Whether a browser sent this request from another site's page: Sec-Fetch-Site says so, or
    (older browsers) the Origin is not one of the allowed hosts. A request without either header
    comes from a program (curl, an SDK), not from a page."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return False
    host = urlsplit(origin).netloc if origin != "null" else ""
    return not is_allowed_host(host or None, allowed)


def check_allowed_hosts(names: Iterable[str]) -> tuple[str, ...]:
    """`--allowed-host` values, normalised; ConfigError naming a value that is not a host name."""
    out = []
    for name in (names,) if isinstance(names, str) else names:
        if not isinstance(name, str) or not name.strip() or any(c in name for c in "/ \t@?#"):
            raise ConfigError(f"allowed host (--allowed-host) {name!r} is not a host name; give a name or address such as "
                              f"photos.lan or 192.168.1.5 (no scheme, path or port), or '*' for any")
        out.append(ANY_HOST if name.strip() == ANY_HOST else normalize_host(name))
    return tuple(out)
