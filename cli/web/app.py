"""The console's web application (Starlette): server-rendered pages, refreshed in place by a
small script (static/console.js asks for the page's content again every --refresh seconds,
with the header X-Console-Fragment, and swaps it in).

Each page's read (cli.web.reads) runs in a thread under the page's timeout: a cluster that does
not answer gives an error page when it runs out, never a page that hangs (the thread is left to
end on its own client timeouts). Every error is a page that says what went wrong and what to
do, with its HTTP status; no stack trace reaches the browser.

GET never changes the cluster. With allow_changes, the settings page has forms that POST live
broker settings and quotas, each checked against the console's form token and the request's
Origin, and logged with its author (the login name, else the client's address).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.errors import (
    AuthenticationFailed,
    BrokerError,
    CorruptSegment,
    PylogError,
    RegistryAccessDenied,
    Unavailable,
)
from broker.protocol import ErrorCode
from broker.quotas import DEFAULT as QUOTA_DEFAULT
from broker.quotas import Kind, Quota
from broker.registry.settings import DEFAULT as EVERY_BROKER
from cli.web import show
from cli.web.history import chart
from cli.web.reads import PAGE_MESSAGES, BadRequest, NotFound, Reads

log = logging.getLogger("pylog.console")

HERE = Path(__file__).parent
FRAGMENT_HEADER = "X-Console-Fragment"
READ_POSITION_ERRORS = frozenset({ErrorCode.INVALID_OFFSET, ErrorCode.OFFSET_OUT_OF_RANGE})
"""The broker's errors for a message browser's start that is off a message or out of range."""
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """How the console serves: pylog-console's options."""

    refresh_s: float = 5.0
    page_timeout_s: float = 15.0
    history_interval_s: float = 30.0
    """How often the sampler reads the watched groups' lag (0: only when their pages do)."""
    allow_changes: bool = False
    token: str | None = None
    """The login's password (any user name), or None: no login."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TokenLogin:
    """HTTP Basic authentication against the console's token, any user name (kept as the
    request's author for the change log), or `Authorization: Bearer TOKEN`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        user = self._user(Headers(scope=scope).get("authorization", ""))
        if user is None:
            response = PlainTextResponse(
                "pylog-console: log in with any user name and the console's token as the "
                "password (pylog-console --token-file; docs/console.md)",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="pylog-console", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send)

    def _user(self, authorization: str) -> str | None:
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer":
            return "bearer" if hmac.compare_digest(credentials.encode(), self.token) else None
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(password.encode(), self.token):
            return None
        return user or "-"


class Console:
    """The pages of one cluster (`reads`), served as `settings` say."""

    def __init__(self, reads: Reads, settings: Settings) -> None:
        self.reads = reads
        self.settings = settings
        self.form_token = secrets.token_urlsafe(24)
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.globals.update(show=show, settings=settings)
        self._stop = threading.Event()

    def app(self) -> ASGIApp:
        routes = [
            Route("/", self.cluster_page),
            Route("/topics", self.topics_page),
            Route("/topics/{name}", self.topic_page),
            Route("/groups", self.groups_page),
            Route("/groups/{name}", self.group_page),
            Route("/messages", self.messages_page),
            Route("/mirrors", self.mirrors_page),
            Route("/settings", self.settings_page),
            Route("/settings/broker", self.change_broker_setting, methods=["POST"]),
            Route("/settings/quota", self.change_quota, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        app: ASGIApp = Starlette(routes=routes, lifespan=self._lifespan)
        if self.settings.token is not None:
            app = TokenLogin(app, self.settings.token)
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        sampler = threading.Thread(target=self._sample, name="lag-sampler", daemon=True)
        sampler.start()
        try:
            yield
        finally:
            self._stop.set()
            await anyio.to_thread.run_sync(sampler.join, abandon_on_cancel=True)
            self.reads.close()

    def _sample(self) -> None:
        """Read every watched group's lag each history interval (LagHistory), until stopped."""
        interval = self.settings.history_interval_s
        while interval > 0 and not self._stop.wait(interval):
            for group in self.reads.history.watched():
                try:
                    self.reads.group(group, viewed=False)
                except (PylogError, NotFound) as error:
                    log.info("lag of group %s not sampled: %s", group, error)

    # Rendering.

    async def _read(self, read: Callable[[], T]) -> T:
        with anyio.fail_after(self.settings.page_timeout_s):
            return await anyio.to_thread.run_sync(read, abandon_on_cancel=True)

    async def _page(
        self,
        request: Request,
        template: str,
        read: Callable[[], dict[str, Any]],
        on_error: dict[str, Any] | None = None,
        refresh: bool = True,
    ) -> Response:
        """`template` with what `read` returns, updated live with `refresh`; for what it
        raised, the error page, or with `on_error` `template` itself with that context and
        the error in it."""
        try:
            context = await self._read(read)
        except Exception as error:  # every failure is a page, never a trace (logged below)
            if on_error is None:
                return self._error(request, error)
            return self._error(request, error, template, on_error)
        return self._render(request, template, {"refresh": refresh, **context})

    def _render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        context = {
            "fragment": request.headers.get(FRAGMENT_HEADER) == "1",
            "form_token": self.form_token,
            "page": request.url.path.split("/")[1] or "cluster",  # the menu's entry
            **context,
        }
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    def _error(
        self,
        request: Request,
        error: BaseException,
        template: str = "error.html",
        context: dict[str, Any] | None = None,
    ) -> Response:
        """The page for `error` (`template`, with `context` and the error's title, message and
        advice), with its status; one the console did not expect is logged with its trace."""
        status, title, hint = self._explain(error)
        if status >= 500 and not isinstance(error, (PylogError, TimeoutError)):
            log.error("page %s failed", request.url.path, exc_info=error)
        failure = {"title": title, "message": _error_text(error) or title, "hint": hint}
        refresh = request.method == "GET" and template == "error.html"  # until it reads again
        context = {"refresh": refresh, **(context or {}), "failure": failure}
        return self._render(request, template, context, status)

    def _explain(self, error: BaseException) -> tuple[int, str, str]:
        """The status, title and advice of the page for `error`."""
        broker = self.reads.target.broker
        if isinstance(error, NotFound):
            return 404, "Not found", ""
        if isinstance(error, (BadRequest, ValueError)):
            return 400, "Bad request", ""
        if isinstance(error, TimeoutError):
            return (
                504,
                "The cluster did not answer in time",
                f"No answer within {self.settings.page_timeout_s:g} s (--page-timeout). "
                "The page tries again at its next refresh.",
            )
        if isinstance(error, Unavailable):
            curve = (
                ""
                if self.reads.target.keys
                else (
                    " If the cluster serves CurveZMQ, start the console with its keys "
                    "(--key-file and --broker-key, as pylogctl)."
                )
            )
            return 503, "Broker unreachable", f"No answer from {broker}.{curve}"
        if isinstance(error, AuthenticationFailed):
            given = "the keys it was given (--key-file, --broker-key)"
            keys = given if self.reads.target.keys else "no keys (--key-file, --broker-key)"
            return 403, "The broker refused the console", f"The console presents {keys}."
        if isinstance(error, RegistryAccessDenied):
            return (
                403,
                "ZooKeeper refused the console",
                "The registry has ACLs: start the console with --zookeeper-auth-file "
                "(docs/security.md).",
            )
        if isinstance(error, BrokerError):
            if error.code in READ_POSITION_ERRORS:
                return (
                    400,
                    "Not a position to read from",
                    (
                        "Read from a message's first byte: earliest, end, a time, or an offset "
                        "the pages show."
                    ),
                )
            if error.code == ErrorCode.AUTHORIZATION_FAILED:
                return (
                    403,
                    "Not allowed",
                    "The console's principal has no ACL for this (pylogctl acl add; "
                    "docs/security.md).",
                )
            return 502, f"The broker answered {error.name}", ""
        if isinstance(error, CorruptSegment):
            return 502, "Damaged data", "Read from the offset after it: its end, as named."
        if isinstance(error, PylogError):
            return 502, "The cluster could not be read", ""
        return 500, "The console failed", "Its log has the details."

    # Pages.

    async def cluster_page(self, request: Request) -> Response:
        return await self._page(
            request, "cluster.html", lambda: {"view": self.reads.cluster_view()}
        )

    async def topics_page(self, request: Request) -> Response:
        return await self._page(request, "topics.html", lambda: {"topics": self.reads.topics()})

    async def topic_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        return await self._page(request, "topic.html", lambda: {"topic": self.reads.topic(name)})

    async def groups_page(self, request: Request) -> Response:
        return await self._page(request, "groups.html", lambda: {"groups": self.reads.groups()})

    async def group_page(self, request: Request) -> Response:
        name = request.path_params["name"]

        def read() -> dict[str, Any]:
            lag = self.reads.group(name)
            history = self.reads.history
            samples = history.samples(name)
            return {
                "lag": lag,
                "chart": chart(samples, history.clock(), history.window_s),
            }

        return await self._page(request, "group.html", read)

    async def messages_page(self, request: Request) -> Response:
        query = request.query_params
        form = {
            "topic": query.get("topic", ""),
            "partition": query.get("partition", "0"),
            "from": query.get("from", "earliest"),
            "skip": query.get("skip", "0"),
            "count": query.get("count", str(PAGE_MESSAGES)),
            "view": query.get("view", "auto"),
        }
        if not form["topic"]:
            return self._render(request, "messages.html", {"form": form})
        try:
            partition, skip, count = (
                _number(form[name], name) for name in ("partition", "skip", "count")
            )
            if form["view"] not in show.VIEWS:
                raise BadRequest(f"view {form['view']!r}: one of {', '.join(show.VIEWS)}")
        except BadRequest as error:
            return self._error(request, error, "messages.html", {"form": form})

        def read() -> dict[str, Any]:
            page = self.reads.messages(form["topic"], partition, form["from"], skip, count)
            following = {**form, "from": str(page.next.offset), "skip": str(page.next.skip)}
            return {
                "form": form,
                "result": page,
                "next_url": "/messages?" + urlencode(following),
            }

        return await self._page(request, "messages.html", read, {"form": form}, refresh=False)

    async def mirrors_page(self, request: Request) -> Response:
        return await self._page(request, "mirrors.html", lambda: {"mirrors": self.reads.mirrors()})

    async def settings_page(self, request: Request) -> Response:
        done = request.query_params.get("done")

        def read() -> dict[str, Any]:
            view = self.reads.settings()
            kinds = [(kind, sorted(view.quotas.quotas.get(kind, {}).items())) for kind in Kind]
            return {
                "view": view,
                "kinds": kinds,
                "done": done,
                "every_broker": EVERY_BROKER,
                "quota_default": QUOTA_DEFAULT,
            }

        return await self._page(request, "settings.html", read, refresh=False)

    # Changes (POST, with --allow-changes).

    async def _change(
        self, request: Request, change: Callable[[str, dict[str, str]], str]
    ) -> Response:
        """Check that changes are allowed and that the form is the console's own, then run
        `change(author, form)` in a thread and go back to the settings page saying what it
        did (or the error page)."""
        if not self.settings.allow_changes:
            return self._refused(
                request,
                "Changes not allowed",
                "this console is read-only: start it with --allow-changes",
            )
        async with request.form() as submitted:
            form = {k: v for k, v in submitted.items() if isinstance(v, str)}
        origin = request.headers.get("origin")
        same_origin = origin is None or urlsplit(origin).netloc == request.headers.get("host")
        token = form.get("form_token", "").encode()
        if not same_origin or not hmac.compare_digest(token, self.form_token.encode()):
            return self._refused(
                request,
                "Form refused",
                "the form did not come from this console's settings page: reload it",
            )
        who = request.scope.get("state", {}).get("user") or "-"
        client = request.client
        who = f"{who} from {client.host if client else 'unknown'}"
        try:
            done = await self._read(lambda: change(who, form))
        except Exception as error:
            return self._error(request, error)
        return RedirectResponse("/settings?" + urlencode({"done": done}), status_code=303)

    def _refused(self, request: Request, title: str, message: str) -> Response:
        failure = {"title": title, "message": message, "hint": ""}
        return self._render(request, "error.html", {"failure": failure}, 403)

    async def change_broker_setting(self, request: Request) -> Response:
        def change(who: str, form: dict[str, str]) -> str:
            entry = form.get("broker", "").strip() or EVERY_BROKER
            name = form.get("name", "").strip()
            if not name:
                raise BadRequest("name the setting, as section.key (log.retention_ms)")
            whom = "every broker" if entry == EVERY_BROKER else f"broker {entry}"
            if form.get("action") == "delete":
                self.reads.delete_broker_setting(who, entry, name)
                return f"{name} deleted for {whom}"
            value = form.get("value", "").strip()
            self.reads.set_broker_setting(who, entry, name, value)
            return f"{name}={value} set for {whom}"

        return await self._change(request, change)

    async def change_quota(self, request: Request) -> Response:
        def change(who: str, form: dict[str, str]) -> str:
            try:
                kind = Kind(form.get("kind", ""))
            except ValueError:
                raise BadRequest("kind: principal or client") from None
            name = form.get("name", "").strip() or QUOTA_DEFAULT
            if form.get("action") == "delete":
                self.reads.delete_quota(who, kind, name)
                return f"quota of {kind} {name} deleted"
            rates = [_rate(form.get(field, "")) for field in ("produce", "fetch")]
            quota = Quota(*rates)
            self.reads.set_quota(who, kind, name, quota)
            return f"quota of {kind} {name} set"

        return await self._change(request, change)


def _number(text: str, name: str) -> int:
    if not text.strip().isdecimal():
        raise BadRequest(f"{name} {text!r}: a whole number, 0 or more")
    return int(text)


def _rate(text: str) -> int | None:
    """A quota form's bytes a second: empty for no limit."""
    return None if not text.strip() else _number(text, "bytes a second")


def _error_text(error: BaseException) -> str:
    if isinstance(error, BrokerError):
        return error.message or error.name
    if isinstance(error, TimeoutError):
        return ""
    return str(error)
