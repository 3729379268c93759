"""Who may open a session (no Panel import).

The app runs models and reads server files on behalf of whoever opens it, so by default only this machine
may: a session from a non-loopback client address is refused with a page that says why, whatever address
`panel serve` listens on (a plain `panel serve app.py` listens on every interface). Remote use is an
explicit choice: set `RLXVIZ_ALLOW_REMOTE=1` (and list the origins with `--allow-websocket-origin`).
The address is the TCP peer's (`panel serve --use-xheaders` would make it the proxy's `X-Forwarded-For`).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

ALLOW_REMOTE_ENV = "RLXVIZ_ALLOW_REMOTE"
"""Set to `1` (or `true`, `yes`) to serve sessions to clients on other machines."""

_YES = ("1", "true", "yes", "on")


def remote_allowed(env: Mapping[str, str] | None = None) -> bool:
    """Whether `RLXVIZ_ALLOW_REMOTE` enables sessions from other machines."""
    return (os.environ if env is None else env).get(ALLOW_REMOTE_ENV, "").strip().lower() in _YES


def is_loopback(address: str | None) -> bool:
    """True for a loopback client address (`127.0.0.0/8`, `::1`, `::ffff:127.x.y.z`); False for anything else,
    including an unknown (None) or malformed address."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def refusal(address: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """None when a client at `address` may open a session, else the refusal's text (plain, no markup)."""
    if is_loopback(address) or remote_allowed(env):
        return None
    return (f"This rlxviz server only serves this machine, and your address ({address or 'unknown'}) is not a "
            f"loopback address. To use it from another machine, whoever runs the server must allow it explicitly: "
            f"start it with {ALLOW_REMOTE_ENV}=1 and --allow-websocket-origin=HOST:PORT (only on a network you "
            f"trust: the app runs models and, with RLXVIZ_ALLOWED_DIRS, reads server folders for every visitor). "
            f"On the server itself, open http://localhost:PORT/app.")


__all__ = ["ALLOW_REMOTE_ENV", "is_loopback", "refusal", "remote_allowed"]
