"""The dashboard's guards: allowed hosts, security headers, action methods and tokens.

What a hostile page in the operator's browser could try, and what stops it:

- DNS rebinding (its own name resolved to 127.0.0.1, so that it is
  same-origin with the dashboard): `HostGuard` answers 400 to any ``Host``
  not on the allow-list, before routing.
- An action by a request a page can send without a preflight (``HEAD`` from
  a no-cors ``fetch``, a plain form): only a POST acts (`ActionGuard.asks`),
  from this origin or a trusted one, scheme included, carrying a token
  (`ActionTokens`) made for that very action and at most an hour old.
- Framing, sniffing, leaking: `SecurityHeaders` sets the headers on every
  response, a 500 included (`GuardedStarlette` wraps it outside Starlette's
  error middleware).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse

from pgqueue._extension import check_origin

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LOOPBACK_HOSTS",
    "MAX_FORM_BYTES",
    "ActionGuard",
    "ActionTokens",
    "AllowedHosts",
    "GuardedStarlette",
    "HostGuard",
    "SecurityHeaders",
    "check_allowed_host",
    "check_allowed_hosts",
    "check_secret",
    "check_trusted_origins",
]

logger = logging.getLogger("pgqueue.web")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The names of this machine a browser uses: the default allow-list (any port)."""

MIN_SECRET_BYTES = 16
"""A shorter ``secret`` could be guessed, and with it every token."""

TOKEN_LIFETIME = 3600.0
"""Seconds a confirmation page's token stays good."""

CLOCK_SKEW = 60.0
"""Seconds a token may seem to come from the future (another process's clock)."""

MAX_FORM_BYTES = 4096
"""The largest action form accepted by default (a token, two names, a filter)."""

ACTION_METHODS = ("GET", "HEAD", "POST")
"""GET and HEAD ask (the confirmation page); only POST acts."""

_CSP = (
    b"default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    b"img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""Only the dashboard's own files; no inline script or style; never in a frame."""

_HEADERS = (
    (b"content-security-policy", _CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
_HEADER_NAMES = frozenset(name for name, _ in _HEADERS)

_NAME = re.compile(r"[a-z0-9_.-]+")
_TOKEN = re.compile(r"[0-9a-f]{80}")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


# --- hosts -----------------------------------------------------------------------------


def _split_host(text: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header or an allow-list entry; None if it is neither.

    Names are lowercased; an IPv6 address keeps its brackets.
    """
    text = text.lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        if not bracket:
            return None
        name = f"[{name}]"
    else:
        name, colon, port = text.partition(":")
        rest = colon + port
        if not _NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    port_text = rest[1:]
    if not (rest[0] == ":" and port_text.isascii() and port_text.isdigit()):
        return None
    if len(port_text) > 5 or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


class AllowedHosts:
    """The ``Host`` headers the dashboard answers to.

    An entry without a port allows its name with any port; one with a port
    allows that port only (a ``Host`` without one has its scheme's default).
    """

    def __init__(self, entries: Iterable[tuple[str, int | None]], *, anything: bool):
        self._entries = frozenset(entries)
        self.anything = anything

    def allows(self, host: str, scheme: str) -> bool:
        """Whether a request with this ``Host`` header (and scheme) may be served."""
        if self.anything:
            return True
        split = _split_host(host)
        if split is None:
            return False
        name, port = split
        if (name, None) in self._entries:
            return True
        return (name, port or _DEFAULT_PORTS.get(scheme)) in self._entries


def check_allowed_host(value: object) -> str:
    """Return ``value`` if it is an allow-list entry: ``'*'``, a name or address, a port."""
    if not isinstance(value, str):
        msg = f"an allowed host must be a str, not {type(value).__name__}"
        raise TypeError(msg)
    if value != "*" and _split_host(value) is None:
        msg = (
            f"{value!r} is not a host: a name or address with an optional port, as "
            "ops.example.com, 10.0.0.5:8080 or [::1]:8080 (or '*' for any)"
        )
        raise ValueError(msg)
    return value


def check_allowed_hosts(values: Sequence[str] | None) -> AllowedHosts:
    """The allow-list of ``create_app(allowed_hosts=...)``; None means this machine's names.

    ``'*'`` allows every host, and says in a warning what that opens.
    """
    if values is None:
        return AllowedHosts(((name, None) for name in LOOPBACK_HOSTS), anything=False)
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        msg = f"allowed_hosts must be a sequence of hosts, not {type(values).__name__}"
        raise TypeError(msg)
    values = list(values)
    entries = []
    for value in values:
        try:
            check_allowed_host(value)
        except (TypeError, ValueError) as exc:
            msg = f"allowed_hosts: {exc}"
            raise type(exc)(msg) from None
        split = _split_host(value)
        if split is not None:
            entries.append(split)
    anything = "*" in values
    if anything:
        logger.warning(
            "allowed_hosts=['*']: the dashboard answers to any Host header, so a page "
            "of any site its users' browsers open can read it (and, with the token it "
            "reads, act) by DNS rebinding; list the dashboard's host names instead"
        )
    return AllowedHosts(entries, anything=anything)


class HostGuard:
    """Answers 400 to a request whose ``Host`` is not allowed, before routing.

    A page of ``attacker.example`` whose name was rebound to this address
    sends ``Host: attacker.example``; without this it would be same-origin
    with the dashboard.
    """

    def __init__(self, app: ASGIApp, *, hosts: AllowedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.hosts.anything:
            await self.app(scope, receive, send)
            return
        found = [v for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        host = found[0].decode("latin-1") if len(found) == 1 else ""
        if self.hosts.allows(host, scope.get("scheme", "http")):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            refusal = PlainTextResponse(
                "Bad request: this dashboard does not answer to that host name "
                "(see allowed_hosts, or --allowed-host of pgqueue web).\n",
                status_code=400,
                headers={"cache-control": "no-store"},
            )
            await refusal(scope, receive, send)


# --- headers ---------------------------------------------------------------------------


class SecurityHeaders:
    """Sets the security headers on every response.

    A Content-Security-Policy of the dashboard's own files only, no framing,
    no sniffing, no referrer beyond this origin, and no reading of its
    responses from another origin (``Cross-Origin-Resource-Policy``).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in _HEADER_NAMES
                ]
                message["headers"] = [*kept, *_HEADERS]
            await send(message)

        await self.app(scope, receive, sending)


class GuardedStarlette(Starlette):
    """Starlette with `SecurityHeaders` outermost: on a 500 too.

    Starlette's own error middleware answers a 500 outside every middleware
    the app is given, so the headers are set around it.
    """

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


# --- actions ---------------------------------------------------------------------------


def check_secret(value: object) -> bytes:
    """The key of the actions' tokens: ``value``'s bytes, or random ones for None."""
    if value is None:
        return secrets.token_bytes(32)
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        msg = f"secret must be a str or bytes, or None, not {type(value).__name__}"
        raise TypeError(msg)
    if len(value) < MIN_SECRET_BYTES:
        msg = (
            f"secret must be at least {MIN_SECRET_BYTES} bytes long, not {len(value)}: "
            "a short one can be guessed, and every token with it"
        )
        raise ValueError(msg)
    return value


def check_trusted_origins(values: object) -> frozenset[str]:
    """The trusted origins, as browsers send them; ValueError for one that is not."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        msg = f"trusted_origins must be a sequence of origins, not {type(values).__name__}"
        raise TypeError(msg)
    found = set()
    for value in values:
        try:
            found.add(check_origin(value))
        except ValueError as exc:
            msg = f"trusted_origins: {exc}"
            raise ValueError(msg) from None
    return frozenset(found)


class ActionTokens:
    """CSRF tokens bound to one action and a time window.

    A token is its issue time (16 hex digits of Unix seconds) and an
    HMAC-SHA256 of that time, the action (its path in the app, as
    ``/jobs/5/retry``) and the form fields that say what it acts on. It is
    good for `TOKEN_LIFETIME` seconds, for that action only. Processes with
    the same secret accept each other's tokens.

    Args:
        secret: the key (at least 16 bytes); None for random bytes of this
            object's own.

    Raises:
        TypeError, ValueError: a secret of another type, or too short.
    """

    def __init__(self, secret: str | bytes | None = None) -> None:
        self._key = check_secret(secret)

    def issue(
        self,
        action: str,
        fields: Mapping[str, str] | None = None,
        *,
        now: float | None = None,
    ) -> str:
        """A token for ``action`` with these ``fields``, issued ``now`` (default: now)."""
        issued = max(0, int(time.time() if now is None else now))
        return f"{issued:016x}{self._mac(issued, action, fields)}"

    def valid(
        self,
        token: str,
        action: str,
        fields: Mapping[str, str] | None = None,
        *,
        now: float | None = None,
    ) -> bool:
        """Whether ``token`` was issued for this action and fields, under an hour ago."""
        if not _TOKEN.fullmatch(token):
            return False
        issued = int(token[:16], 16)
        age = (time.time() if now is None else now) - issued
        if not -CLOCK_SKEW <= age <= TOKEN_LIFETIME:
            return False
        return hmac.compare_digest(token[16:], self._mac(issued, action, fields))

    def _mac(self, issued: int, action: str, fields: Mapping[str, str] | None) -> str:
        message = json.dumps(
            ["pgqueue.web action", issued, action, sorted((fields or {}).items())],
            separators=(",", ":"),
        )
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()


class ActionGuard:
    """Decides whether a request may act: enabled, a POST, same origin, its token.

    Args:
        read_only: refuse every action (and its confirmation) with 403.
        secret: the tokens' key (see `ActionTokens`).
        trusted_origins: origins besides the request's own whose pages may
            post actions.
    """

    def __init__(
        self,
        *,
        read_only: bool,
        secret: str | bytes | None,
        trusted_origins: Sequence[str],
    ) -> None:
        self.read_only = read_only
        self._tokens = ActionTokens(secret)
        self._origins = check_trusted_origins(trusted_origins)

    def asks(self, request: Request) -> bool:
        """True for GET and HEAD (show the confirmation, change nothing), False for POST.

        Raises:
            HTTPException: 403 when read-only; 405 for any other method.
        """
        if self.read_only:
            raise HTTPException(403, "this dashboard is read-only")
        if request.method not in ACTION_METHODS:
            raise HTTPException(405, headers={"Allow": ", ".join(ACTION_METHODS)})
        return request.method != "POST"

    def token(self, action: str, fields: Mapping[str, str] | None = None) -> str:
        """The token of a confirmation page's form for ``action`` and ``fields``."""
        return self._tokens.issue(action, fields)

    async def form(
        self,
        request: Request,
        action: str,
        bound: Sequence[str] = (),
        *,
        max_bytes: int = MAX_FORM_BYTES,
    ) -> dict[str, str]:
        """The POST's form, once it passed every guard; 403 (or 400, 405) otherwise.

        A browser's request must come from this origin (scheme, host and
        port) or a trusted one (``Sec-Fetch-Site``, else ``Origin``, when
        sent); the form must be a form (urlencoded) and carry a token issued
        for ``action`` and the values of the fields named in ``bound``
        (missing ones count as empty), under an hour ago; a form larger than
        ``max_bytes`` is refused (400).
        """
        if self.asks(request):
            raise HTTPException(405, headers={"Allow": ", ".join(ACTION_METHODS)})
        refused = "actions are only accepted from this site's pages"
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            raise HTTPException(403, refused)
        origin = request.headers.get("origin")
        if origin is not None and not self._same_or_trusted(origin, request):
            raise HTTPException(403, refused)
        kind = request.headers.get("content-type", "").partition(";")[0].strip()
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise HTTPException(400, "the form is too large")
        try:
            parsed = parse_qs(body.decode(), max_num_fields=10, strict_parsing=False)
        except (UnicodeDecodeError, ValueError):
            raise HTTPException(400, "the form cannot be read") from None
        form = {name: values[-1] for name, values in parsed.items()}
        if kind != "application/x-www-form-urlencoded":
            form = {}  # only a form of this site's pages carries the token
        fields = {name: form.get(name, "") for name in bound}
        if not self._tokens.valid(form.get("csrf", ""), action, fields):
            raise HTTPException(
                403, "the form's token is missing or stale: reload the page"
            )
        return form

    def _same_or_trusted(self, origin: str, request: Request) -> bool:
        """Whether ``origin`` is the request's own (scheme too) or a trusted one."""
        try:
            theirs = check_origin(origin)
        except (TypeError, ValueError):
            return False
        if theirs in self._origins:
            return True
        host = request.headers.get("host", "")
        try:
            return theirs == check_origin(f"{request.url.scheme}://{host}")
        except (TypeError, ValueError):
            return False
