"""The HTTP side of :class:`~tapekit.llm.openai_compat.OpenAICompatibleLLM`, on aiohttp.

One ``aiohttp.ClientSession`` per event loop (sessions belong to the loop that made them), closed
when that loop shuts down its async generators (``asyncio.run`` does, and so do tapekit's sync
wrappers) or by :meth:`SessionPool.aclose`. :func:`open_stream` posts a request and retries
with backoff, before any byte of the answer is read, on the statuses and failures that may pass
(408, 409, 429, 5xx, connection errors, timeouts), honouring ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from tapekit.errors import TapekitError

if TYPE_CHECKING:
    import aiohttp


RETRY_STATUSES = frozenset({408, 409, 429})
MAX_RETRY_AFTER_S = 60.0


class HTTPStatusFailure(TapekitError):
    """The server answered with an error status (after any retries)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class TransportFailure(TapekitError):
    """No answer: the connection failed or timed out (after any retries)."""

    def __init__(self, timed_out: bool, detail: str) -> None:
        super().__init__(detail)
        self.timed_out = timed_out
        self.detail = detail


def _import_aiohttp() -> Any:
    try:
        import aiohttp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "OpenAICompatibleLLM needs the aiohttp package: pip install 'tapekit[openai]'"
        ) from e
    return aiohttp


@functools.cache
def _ssl_context() -> ssl.SSLContext | bool:
    """Certificates as the openai SDK (httpx) verifies them: certifi's bundle when installed,
    else the system's (True: aiohttp's default context)."""
    try:
        import certifi
    except ImportError:
        return True
    return ssl.create_default_context(cafile=certifi.where())


def env_proxy(scheme: str, host: str) -> str | None:
    """The proxy that ``HTTP(S)_PROXY`` / ``NO_PROXY`` give for a host, decided once per
    client (aiohttp's own ``trust_env`` would read the environment on every request)."""
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


class SessionPool:
    """One client session per event loop, made on first use on that loop.

    Calls on one loop share its session (and its pooled connections); calls from other threads'
    loops get their own, so no session is ever used from a loop it does not belong to.
    """

    __slots__ = ("_sessions", "headers", "https", "limit", "timeout_s")

    def __init__(
        self, headers: Mapping[str, str], timeout_s: float, limit: int | None, https: bool = False
    ) -> None:
        self.headers = dict(headers)
        self.timeout_s = timeout_s
        self.limit = limit
        self.https = https
        self._sessions: dict[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, Any]] = {}

    async def get(self) -> aiohttp.ClientSession:
        """The session of the running loop."""
        loop = asyncio.get_running_loop()
        entry = self._sessions.get(loop)
        if entry is not None and not entry[0].closed:
            return entry[0]
        aiohttp = _import_aiohttp()
        timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=self.timeout_s, sock_read=self.timeout_s
        )
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.limit or 0, ssl=_ssl_context() if self.https else True),
            headers=self.headers,
            timeout=timeout,
            raise_for_status=False,
        )
        keeper = self._keep(loop, session)
        await keeper.__anext__()  # registers it with the loop's shutdown of async generators
        self._sessions[loop] = (session, keeper)
        return session

    async def _keep(
        self, loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession
    ) -> AsyncIterator[None]:
        """Started once on the session's loop: when the loop shuts down its async generators
        (``asyncio.run`` does, as do tapekit's sync calls), this closes the session."""
        try:
            yield
        finally:
            entry = self._sessions.get(loop)
            if entry is not None and entry[0] is session:
                del self._sessions[loop]
            await session.close()

    async def aclose(self) -> None:
        """Close the running loop's session now (a later call makes a new one)."""
        entry = self._sessions.get(asyncio.get_running_loop())
        if entry is not None:
            await entry[1].aclose()


async def open_stream(
    session: aiohttp.ClientSession,
    url: Any,
    body: bytes,
    *,
    max_retries: int,
    timeout_s: float,
    backoff_s: float = 0.5,
    proxy: str | None = None,
) -> aiohttp.ClientResponse:
    """Post ``body`` to ``url`` and return the response once its status is a success.

    Raises :class:`HTTPStatusFailure` or :class:`TransportFailure` when the retries are spent.
    """
    aiohttp = _import_aiohttp()
    attempt = 0
    while True:
        wait: float | None = None
        try:
            response = await session.post(url, data=body, proxy=proxy)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            failure = _transport_failure(e, timeout_s)
            if attempt >= max_retries:
                raise failure from e
        else:
            if response.status < 400:
                return response
            status = response.status
            retry_after = _retry_after(response.headers)
            try:
                text = await response.text(errors="replace")
            except (aiohttp.ClientError, TimeoutError, OSError):
                text = ""
            finally:
                response.release()
            if attempt >= max_retries or not (status in RETRY_STATUSES or status >= 500):
                raise HTTPStatusFailure(status, status_message(text, response.reason))
            wait = retry_after
        if wait is None:
            wait = min(backoff_s * 2**attempt, 8.0) * (1 - 0.25 * random.random())
        attempt += 1
        await asyncio.sleep(wait)


def _transport_failure(error: BaseException, timeout_s: float) -> TransportFailure:
    if isinstance(error, TimeoutError):
        return TransportFailure(True, f"did not answer within {timeout_s} s")
    return TransportFailure(False, f"{type(error).__name__}: {error}")


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait the server asks for (``retry-after-ms`` or ``retry-after`` in seconds), if sane."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue  # an HTTP date: use the usual backoff
        if 0 <= seconds <= MAX_RETRY_AFTER_S:
            return seconds
    return None


def status_message(text: str, reason: str | None) -> str:
    """The human part of an error response: OpenAI's ``error.message``, FastAPI's ``detail``,
    or the start of the body."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if inner.get(key):
                    return str(inner[key])
        elif isinstance(inner, str) and inner:
            return inner
        if data.get("detail"):
            return str(data["detail"])
    text = text.strip()
    if not text:
        return reason or "no message"
    return text if len(text) <= 300 else text[:300] + "..."
