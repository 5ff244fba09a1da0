"""Who is asking: the service's one sign-in interface, and its two kinds.

Every handler asks :meth:`SignIn.person` before it reads anything.

:class:`TokenSignIn` is the standalone sign-in: ``python -m autograder serve
--issue-tokens`` gives each person of ``roster.toml`` a secret
(``secrets.token_urlsafe``, never beginning with ``-``), stored only as its SHA-256.
``python -m autograder submit`` sends it as ``Authorization: Bearer ...``. A browser opens
the link ``/signin?token=...``, which signs no one in: it asks "Sign in as ID?", and only
the page's form (a POST, with its XSRF token and the token in its body) starts a session,
so a link or a form on another site cannot sign a learner in as someone else. The
session's random id rides in an HttpOnly cookie that lasts ``session_days`` (``Secure``
where the request came over HTTPS; behind a proxy, ``serve --behind-proxy`` believes its
``X-Forwarded-Proto``); the database keeps its SHA-256 and when it ends. Signing out, or
new tokens for the person, end it on the server.

:class:`HubSignIn` is the sign-in of ``serve --jupyterhub``, the service run by JupyterHub
(a managed service): JupyterHub's own client library, ``jupyterhub.services.auth``, does
the OAuth with the hub (``HubOAuth``, its callback handler and its XSRF tokens), and asks
the hub who owns a token. Every hub user is a learner, named by their hub name; the
members of one hub group are instructors. ``submit`` sends a hub API token as the Bearer
token (the ``JUPYTERHUB_API_TOKEN`` of the learner's server, or one from ``/hub/token``).
"""
from __future__ import annotations

import os
import secrets
from typing import Callable, Dict, List, Optional, Protocol, Tuple
from urllib.parse import urlparse

from autograder.options import SERVICE_SESSION_DAYS
from autograder.service.config import INSTRUCTOR, LEARNER, PERSON_ID, ConfigError, Person
from autograder.service.db import Store

COOKIE = "autograder-session"   # a session's id (standalone sign-in)
OLD_COOKIE = "autograder-service"  # what services before sessions kept: the token itself
DAY = 86400.0
# what a managed JupyterHub service finds in its environment, and needs here
HUB_ENVIRONMENT = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_CLIENT_ID",
                   "JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_SERVICE_URL")


class Refused(Exception):
    """Someone the sign-in knows who may not use the service: say why (HTTP 403), rather
    than send them to sign in again."""


class SignIn(Protocol):
    """How the service learns who is asking (``handler`` is a Tornado RequestHandler)."""

    prefix: str  # where the service's pages are, e.g. "/" or "/services/autograder/"
    how_to_sign_in: str  # said to a request that is not signed in

    async def person(self, handler) -> Optional[Person]:
        """The person signed in on this request, or None; :class:`Refused` for someone known
        who may not use the service."""

    async def sign_in(self, handler) -> Optional[Person]:
        """Handle ``/signin``: who signs in (None if refused). Where :attr:`confirms`, a GET
        only names them and the POST of the confirmation's form signs the browser in."""

    def login_url(self, handler) -> Optional[str]:
        """Where a browser that is not signed in goes to sign in; None: nowhere."""

    def sign_out(self, handler) -> Optional[str]:
        """Forget this browser's sign-in; the address to send it to next, if any."""

    def page(self, handler: type) -> type:
        """The handler class to serve for one of the service's pages."""

    def own_routes(self) -> list:
        """Routes of the sign-in itself (an OAuth callback), besides the service's pages."""


def bearer(handler) -> Optional[str]:
    return bearer_of(handler.request)


def bearer_of(request) -> Optional[str]:
    """The token of a request's ``Authorization: Bearer`` header, if it has one."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class TokenSignIn:
    """Sign-in with a secret per person, issued from the roster; browsers get sessions."""

    prefix = "/"
    how_to_sign_in = ("Not signed in, or the sign-in link is no longer valid: use the link your "
                      "instructor gave you.")
    confirms = True

    def __init__(self, store: Store, people: Dict[str, Person],
                 session_days: float = SERVICE_SESSION_DAYS,
                 others: Optional[Callable[[str], Optional[Person]]] = None):
        """``others``: who else may have a session, by id (those an LMS launched, LTI)."""
        self.store, self.people, self.session_days = store, people, session_days
        self.others = others or (lambda person_id: None)

    def known(self, person_id: Optional[str]) -> Optional[Person]:
        if not person_id:
            return None
        return self.people.get(person_id) or self.others(person_id)

    def start_session(self, handler, person: Person) -> None:
        """Sign this browser in as ``person``: a new session, its id in the cookie."""
        session = self.store.start_session(person.id, self.session_days * DAY)
        handler.set_cookie(COOKIE, session, httponly=True, samesite="Lax",
                           secure=handler.request.protocol == "https",
                           expires_days=self.session_days)
        handler.clear_cookie(OLD_COOKIE)

    def issue(self, ids: Optional[List[str]] = None) -> List[Tuple[Person, str]]:
        """New tokens for ``ids`` (default: everyone); each replaces the person's old one
        and ends their sessions."""
        issued = []
        for person_id in ids or sorted(self.people):
            person = self.people[person_id]
            token = new_token()
            self.store.set_token(person.id, token)
            issued.append((person, token))
        return issued

    def _of(self, token: Optional[str]) -> Optional[Person]:
        if not token:
            return None
        person_id = self.store.person_of(token)
        return self.people.get(person_id) if person_id else None  # off the roster: refused

    async def person(self, handler) -> Optional[Person]:
        token = bearer(handler)
        if token is not None:  # a wrong bearer token is refused, whatever the cookie says
            return self._of(token)
        session = handler.get_cookie(COOKIE)
        return self.known(self.store.session_person(session) if session else None)

    async def sign_in(self, handler) -> Optional[Person]:
        if handler.request.method != "POST":  # the link: who it names, no one signed in
            return self._of(handler.get_query_argument("token", None))
        person = self._of(handler.get_body_argument("token", None))
        if person is not None:
            self.start_session(handler, person)
        return person

    def login_url(self, handler) -> Optional[str]:
        return None  # a sign-in link is personal: there is no page to send anyone to

    def sign_out(self, handler) -> Optional[str]:
        session = handler.get_cookie(COOKIE)
        if session:
            self.store.end_session(session)
        handler.clear_cookie(COOKIE)
        handler.clear_cookie(OLD_COOKIE)
        return None

    def page(self, handler: type) -> type:
        return handler

    def own_routes(self) -> list:
        return []  # /signin is one of the service's pages


def new_token() -> str:
    """A new secret (256 random bits, URL-safe) that never begins with ``-``, so that it
    can be typed as any option's value (``--token TOKEN``) without being read as an option."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def hub_environment(environ=None) -> Dict[str, str]:
    """The ``JUPYTERHUB_*`` variables a managed service gets; ConfigError if one is missing."""
    environ = os.environ if environ is None else environ
    missing = [name for name in HUB_ENVIRONMENT if not environ.get(name)]
    if missing:
        raise ConfigError(f"--jupyterhub: {', '.join(missing)} not set. JupyterHub sets them "
                          "when it starts the service itself: list `python -m autograder serve "
                          "--jupyterhub` as the `command` of a service in "
                          "c.JupyterHub.services (guide/jupyterhub.md)")
    return {name: environ[name] for name in HUB_ENVIRONMENT}


def hub_address(environ=None) -> Tuple[str, int]:
    """Host and port to listen on: those of ``JUPYTERHUB_SERVICE_URL`` (the service's
    ``url`` in the hub's configuration, where the hub's proxy sends its requests)."""
    url = urlparse(hub_environment(environ)["JUPYTERHUB_SERVICE_URL"])
    if not url.hostname or not url.port:
        raise ConfigError(f"JUPYTERHUB_SERVICE_URL {url.geturl()!r} has no host and port: give "
                          'the service a "url" such as http://127.0.0.1:8765')
    return url.hostname, url.port


class HubSignIn:
    """Sign-in through JupyterHub: hub users are learners, ``group``'s members instructors.

    ``auth`` is a ``jupyterhub.services.auth.HubOAuth`` (by default the one the service's
    ``JUPYTERHUB_*`` environment configures). The pages are served under the service's
    prefix; in :meth:`page` each is given JupyterHub's ``HubOAuthenticated`` mixin, which
    brings the hub's login redirect (with its OAuth state) and its XSRF tokens, bound to
    the hub session (Tornado's plain ones could be planted by any page of the same hub).
    """

    def __init__(self, group: str, auth=None):
        from jupyterhub.services.auth import HubOAuth
        self.group = group
        self.auth = auth if auth is not None else HubOAuth(cache_max_age=60)
        self.prefix = self.auth.base_url  # JUPYTERHUB_SERVICE_PREFIX, e.g. /services/autograder/
        self.how_to_sign_in = (
            "Not signed in to JupyterHub, or this token may not use the service: a hub token "
            f"needs the scope access:services!service={self.service_name}")

    @property
    def service_name(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "") or \
            self.prefix.rstrip("/").rsplit("/", 1)[-1]

    def of(self, model: Optional[dict]) -> Optional[Person]:
        """The person a hub user model (``GET /hub/api/user``) is: a learner, or an instructor
        if in the group; None for no one. :class:`Refused` for a hub service's token, and for
        a hub name that cannot be a student id (it names the learner's folders)."""
        if not model:
            return None
        if model.get("kind", "user") != "user":
            raise Refused(f"a token of the hub service {model.get('name')!r} is not a learner's")
        name = model.get("name", "")
        if not PERSON_ID.match(name):
            raise Refused(f"your hub name {name!r} cannot be a student id here (letters, digits, "
                          "_ . -, at most 64, a letter or digit first): ask your instructor")
        return Person(name, INSTRUCTOR if self.group in model.get("groups", ()) else LEARNER)

    async def person(self, handler) -> Optional[Person]:
        from jupyterhub.services.auth import UserNotAllowed
        model = await self.auth.get_user(handler, sync=False)
        if not model:
            return None
        try:  # the scopes the hub gives a token for this service (access:services!service=)
            model = handler.check_hub_user(model)
        except UserNotAllowed:
            raise Refused(f"this hub token may not use the service: it needs the scope "
                          f"access:services!service={self.service_name}") from None
        handler.current_user = model  # for the library's own later look-ups
        return self.of(model)

    sign_in = person  # GET /signin: the OAuth of login_url has signed the browser in
    confirms = False

    def login_url(self, handler) -> Optional[str]:
        return handler.get_login_url()  # the hub's authorize URL, with a fresh OAuth state

    def sign_out(self, handler) -> Optional[str]:
        self.auth.clear_cookie(handler)
        return self.auth.hub_host + self.auth.hub_prefix + "logout"

    def own_routes(self) -> list:
        """The library's OAuth callback, at the ``oauth_redirect_uri`` the hub was given."""
        from jupyterhub.services.auth import HubOAuthCallbackHandler
        callback = type("OAuthCallback", (HubOAuthCallbackHandler,), {"_hub_auth": self.auth})
        return [(urlparse(self.auth.oauth_redirect_uri).path, callback)]

    def page(self, handler: type) -> type:
        from jupyterhub.services.auth import HubOAuthenticated

        def check_xsrf_cookie(page) -> None:
            # `submit`'s Bearer requests carry no form and need no XSRF token: a browser
            # never adds an Authorization header by itself, and the hub checks the token
            if bearer(page) is None:
                HubOAuthenticated.check_xsrf_cookie(page)
        return type(handler.__name__, (HubOAuthenticated, handler),
                    {"_hub_auth": self.auth, "check_xsrf_cookie": check_xsrf_cookie,
                     "__module__": handler.__module__})
