"""One way to reach the shared store: an authenticated redis-py asyncio client.

The store is a privilege boundary (it holds rollouts, leases and budgets), so an open
Redis is refused: the URL must carry a password (``redis://:PASS@host/0``), an ACL user
(``redis://user:PASS@host/0``), or the password comes from ``state.redis_password_file``.
``rediss://`` is TLS. Values are JSON or plain strings: nothing read back is executed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


class StoreError(RuntimeError):
    """The store cannot be used as configured; the message is one line a user can act on."""


class StoreUnreachable(StoreError):
    """The store did not answer (as opposed to refusing us): a replica may degrade and retry."""


def _password(url: str, password_file: Path | None) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StoreError(f"state.redis_url: scheme {parts.scheme!r} is not redis://, rediss:// or unix://")
    if parts.password:
        return None  # the URL has it
    if password_file is None:
        raise StoreError("state.redis_url has no password and no state.redis_password_file is set: "
                         "an open Redis is refused (put the password in the URL or a file)")
    secret = Path(password_file).expanduser().read_text(encoding="utf-8").strip()
    if not secret:
        raise StoreError(f"state.redis_password_file {password_file} is empty")
    return secret


def redact(url: str) -> str:
    """The URL as it may appear in logs: never its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def client(url: str, password_file: Path | None = None, *, timeout_s: float = 1.0) -> aioredis.Redis:
    """A client for ``url`` (not connected yet). Short timeouts: a replica whose store is
    gone must notice within a tick and degrade, not hang a request. One retry at once (a
    pooled connection is dead after a Redis restart), not redis-py's default of three with
    backoff up to 10 s, which made one call to a vanished store take ten times the timeout."""
    extra = _password(url, password_file)
    kwargs = {"password": extra} if extra is not None else {}
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                   retry=Retry(NoBackoff(), 1), decode_responses=True, **kwargs)


async def connect(url: str, password_file: Path | None = None, *, timeout_s: float = 1.0) -> aioredis.Redis:
    """A client that has authenticated once: a wrong password is a StoreError at start,
    so a replica that cannot authenticate refuses to start with one clear line."""
    r = client(url, password_file, timeout_s=timeout_s)
    try:
        await r.ping()
    except (redis_errors.AuthenticationError, redis_errors.AuthenticationWrongNumberOfArgsError) as e:
        await r.aclose()
        raise StoreError(f"Redis at {redact(url)} refused our credentials: {e}") from None
    except redis_errors.ResponseError as e:
        await r.aclose()
        if "NOAUTH" in str(e) or "WRONGPASS" in str(e):
            raise StoreError(f"Redis at {redact(url)} refused our credentials: {e}") from None
        raise StoreError(f"Redis at {redact(url)}: {e}") from None
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as e:
        await r.aclose()
        raise StoreUnreachable(f"Redis at {redact(url)} is unreachable: {e}") from None
    return r
