"""Who is asking: the service's one sign-in interface, and its standalone kind.

Every handler asks :meth:`SignIn.person` before it reads anything. :class:`TokenSignIn`
is the standalone sign-in: ``python -m autograder serve --issue-tokens`` gives each person
of ``roster.toml`` a secret (``secrets.token_urlsafe``), stored only as its SHA-256; a
browser signs in once through ``/signin?token=...`` (the token then rides in an
HttpOnly cookie), and ``python -m autograder submit`` sends it as
``Authorization: Bearer ...``. A JupyterHub sign-in (OAuth, as a Hub service), planned and
not built yet, would be another class with the same three methods.
"""
from __future__ import annotations

import secrets
from typing import Dict, List, Optional, Protocol, Tuple

from .service_config import Person
from .service_db import Store

COOKIE = "autograder-service"


class SignIn(Protocol):
    """How the service learns who is asking (``handler`` is a Tornado RequestHandler)."""

    def person(self, handler) -> Optional[Person]:
        """The person signed in on this request, or None."""

    def sign_in(self, handler) -> Optional[Person]:
        """Handle ``GET /signin``: sign the browser in and return who, or None if refused."""

    def sign_out(self, handler) -> None:
        """Forget this browser's sign-in."""


def bearer(handler) -> Optional[str]:
    header = handler.request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class TokenSignIn:
    """Sign-in with a secret per person, issued from the roster."""

    def __init__(self, store: Store, people: Dict[str, Person]):
        self.store, self.people = store, people

    def issue(self, ids: Optional[List[str]] = None) -> List[Tuple[Person, str]]:
        """New tokens for ``ids`` (default: everyone); each replaces the person's old one."""
        issued = []
        for person_id in ids or sorted(self.people):
            person = self.people[person_id]
            token = secrets.token_urlsafe(32)
            self.store.set_token(person.id, token)
            issued.append((person, token))
        return issued

    def _of(self, token: Optional[str]) -> Optional[Person]:
        if not token:
            return None
        person_id = self.store.person_of(token)
        return self.people.get(person_id) if person_id else None  # off the roster: refused

    def person(self, handler) -> Optional[Person]:
        token = bearer(handler)
        if token is not None:  # a wrong bearer token is refused, whatever the cookie says
            return self._of(token)
        return self._of(handler.get_cookie(COOKIE))

    def sign_in(self, handler) -> Optional[Person]:
        token = handler.get_query_argument("token", None) or bearer(handler)
        person = self._of(token)
        if person is not None:
            handler.set_cookie(COOKIE, token, httponly=True, samesite="Strict",
                               secure=handler.request.protocol == "https")
        return person

    def sign_out(self, handler) -> None:
        handler.clear_cookie(COOKIE)
