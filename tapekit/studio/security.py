"""Access control for the Studio: an optional bearer token, and CSRF protection for its forms.

- **Token.** When the app has a token, every request needs it: ``Authorization: Bearer TOKEN``,
  or a session cookie. Opening any URL with ``?token=TOKEN`` once sets that cookie (HttpOnly,
  SameSite=Strict) and redirects to the same URL without the token, so the token does not stay
  in the address bar, the history or a ``Referer``.
- **CSRF.** Every page gets a random per-browser token in an HttpOnly, SameSite=Strict cookie;
  every form carries it in a hidden field, and a POST is refused unless the two match and the
  request comes from the Studio's own origin (``Origin`` / ``Sec-Fetch-Site``). A page on another
  site can neither read the cookie nor make the browser send it.
- **Headers.** A strict Content-Security-Policy (scripts and styles only from the Studio itself,
  no inline script), ``nosniff``, no framing, and a same-origin referrer policy.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tapekit.errors import TapekitError

AUTH_COOKIE = "tapekit_studio_auth"
CSRF_COOKIE = "tapekit_studio_csrf"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class CsrfError(TapekitError, PermissionError):
    """A form was posted without the page's CSRF token, or from another origin."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")


def _session_value(token: str) -> str:
    """What the auth cookie holds: derived from the token, so the cookie is not the token."""
    return hmac.new(token.encode(), b"tapekit-studio-session", hashlib.sha256).hexdigest()


class SecurityMiddleware:
    """Token check, the CSRF cookie and security headers, around every request (pure ASGI)."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str | None) -> None:
        self.app = app
        self.token = token
        self.session = _session_value(token) if token else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:  # type: ignore[type-arg]
        """Handle one ASGI call."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        state = scope.setdefault("state", {})
        if self.token is not None:
            outcome = self._authenticate(request)
            if isinstance(outcome, Response):
                outcome.headers["content-security-policy"] = CSP
                outcome.headers["x-content-type-options"] = "nosniff"
                await outcome(scope, receive, send)
                return
            state["bearer"] = outcome == "bearer"
        csrf = request.cookies.get(CSRF_COOKIE)
        new_csrf = None
        if not csrf or len(csrf) != 43:
            csrf = new_csrf = secrets.token_urlsafe(32)
        state["csrf"] = csrf

        async def send_with_headers(message: dict) -> None:  # type: ignore[type-arg]
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"same-origin"),
                ]
                if new_csrf is not None:
                    headers.append((b"set-cookie", _cookie(CSRF_COOKIE, new_csrf).encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _authenticate(self, request: Request) -> Response | str:
        """``"bearer"`` or ``"cookie"`` when the request carries the token, else the response."""
        assert self.token is not None and self.session is not None
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _denied()
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + urlencode(rest) if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.headers.append("set-cookie", _cookie(AUTH_COOKIE, self.session))
            return response
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and hmac.compare_digest(
            header[7:].strip().encode(), self.token.encode()
        ):
            return "bearer"
        cookie = request.cookies.get(AUTH_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session.encode()):
            return "cookie"
        return _denied()


def _cookie(name: str, value: str) -> str:
    return f"{name}={value}; Path=/; HttpOnly; SameSite=Strict"


def _denied() -> Response:
    body = (
        "<!doctype html><meta charset=utf-8><title>Token needed</title>"
        "<h1>401: this Studio needs its access token</h1>"
        "<p>Open the URL that <code>tapekit studio</code> printed (it ends with <code>?token=...</code>), "
        "or send <code>Authorization: Bearer TOKEN</code>.</p>"
    )
    return Response(body, status_code=401, media_type="text/html", headers={"www-authenticate": "Bearer"})


def check_csrf(request: Request, form_token: str | None) -> None:
    """Raise :class:`CsrfError` unless a POST carries this browser's CSRF token and comes from
    the Studio's own origin. Requests with ``Authorization: Bearer`` are exempt: browsers never
    add that header on their own, so such a request cannot be forged by another page."""
    if request.scope.get("state", {}).get("bearer"):
        return
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in {"same-origin", "none"}:
        raise CsrfError(f"refused a form posted from another site (Sec-Fetch-Site: {fetch_site})")
    origin = request.headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin)
        host = request.headers.get("host", "")
        if parts.netloc != host:
            raise CsrfError(f"refused a form posted from origin {origin!r}, not from this Studio")
    expected = request.cookies.get(CSRF_COOKIE)
    if not expected or not form_token or not hmac.compare_digest(expected.encode(), form_token.encode()):
        raise CsrfError("the form's CSRF token is missing or stale: reload the page and try again")
