"""Who may reach the server: binding anything but loopback needs an API key or an explicit
--insecure, so a model server is never opened to a network by accident."""

from __future__ import annotations

import ipaddress

from faste_mm.errors import ConfigError

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


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
