"""The service's LTI routes (:mod:`.lti` has the protocol): ``/lti/jwks`` (the tool's public
key), ``/lti/login`` (the LMS's third-party initiated login), ``/lti/launch`` (where the
platform POSTs the ``id_token``).

These are the only routes an LMS reaches from its own site, so they take no XSRF token and
trust any origin: the login only starts a login, and a launch is accepted only with the
platform's signed token, its nonce unused and the state of this browser's own login.
"""
from __future__ import annotations

import urllib.parse

from tornado.ioloop import IOLoop

from autograder.service.config import Person
from autograder.service.lti import DEEP_LINKING, STATE_COOKIE, LOGIN_SECONDS, LaunchRefused
from autograder.service.pages import Base, content_security_policy


class LtiBase(Base):
    """An LMS's request: no one is signed in yet, and it may come from the LMS's site."""

    async def prepare(self) -> None:
        if self.service.lti is None:
            self.refuse(404, "This service is not set up for an LMS (LTI).")

    def check_xsrf_cookie(self) -> None:
        pass  # the LMS's form carries no token of ours: see the module's docstring

    def check_trusted_origin(self, origin: str) -> bool:
        return True

    def tool_url(self, path: str) -> str:
        """An address of the service as the LMS reaches it: [lti] url, or this request's."""
        base = self.service.lti.config.url or \
            f"{self.request.protocol}://{self.request.host}"
        return base + self.url(path)


class Jwks(LtiBase):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(self.service.lti.jwks)


class Login(LtiBase):
    def get(self) -> None:
        params = {name: self.get_argument(name, "") for name in (
            "iss", "login_hint", "target_link_uri", "client_id", "lti_message_hint")}
        try:
            where, state = self.service.lti.login(params, self.tool_url("lti/launch"))
        except LaunchRefused as why:
            return self.refuse(400, str(why))
        https = self.request.protocol == "https"
        # the launch is a POST from the LMS's site: only a SameSite=None cookie comes with it
        # (browsers take those over https only; over http, Lax serves a same-site test)
        self.set_cookie(STATE_COOKIE, state, path=self.url("lti/"), httponly=True,
                        secure=https, samesite="None" if https else "Lax",
                        max_age=int(LOGIN_SECONDS))
        self.redirect(where, status=302)

    post = get


class Launch(LtiBase):
    async def post(self) -> None:
        lti = self.service.lti
        try:
            # off the event loop: the LMS's keys may have to be fetched (cached 5 minutes)
            launch = await IOLoop.current().run_in_executor(
                None, lti.launch, self.get_body_argument("id_token", ""),
                self.get_body_argument("state", ""), self.get_cookie(STATE_COOKIE))
            if launch.message_type == DEEP_LINKING:
                return self.deep_linking(launch)
            if launch.assignment not in self.service.assignments:
                raise LaunchRefused(f"this LMS link names no assignment of the course "
                                    f"({launch.assignment!r}): ask your instructor to add "
                                    "the link again")
        except LaunchRefused as why:
            self.clear_cookie(STATE_COOKIE, path=self.url("lti/"))
            return self.refuse(403, f"LTI launch refused: {why}")
        self.clear_cookie(STATE_COOKIE, path=self.url("lti/"))
        person = Person(lti.sign_in(launch), launch.role)
        self.service.signin.start_session(self, person)
        self.redirect(self.url("instructor") if person.instructor else self.url(), status=303)

    def deep_linking(self, launch) -> None:
        """An instructor picks an assignment to put into the course: one form per
        assignment, each posting its own signed answer to the LMS."""
        if launch.role != "instructor":
            raise LaunchRefused("only the course's instructors add assignments")
        if not launch.deep_link_return:
            raise LaunchRefused("the deep-linking request has no deep_link_return_url")
        self.clear_cookie(STATE_COOKIE, path=self.url("lti/"))
        self.service.lti.sign_in(launch)  # who they are here, and the course's roster service
        choices = []
        for assignment in self.service.assignments:
            points = self.service.max_points(assignment)
            token = self.service.lti.deep_link_response(
                launch, assignment, assignment, points, self.tool_url("lti/launch"))
            choices.append((assignment, points, token))
        address = urllib.parse.urlsplit(launch.deep_link_return)
        self.set_header("Content-Security-Policy", content_security_policy(
            f"{address.scheme}://{address.netloc}"))  # the forms lead to the LMS
        self.page("lti_deep_link.html", choices=choices, action=launch.deep_link_return)


def routes(at: str) -> list:
    """The LTI routes under the escaped prefix ``at``."""
    return [(at + r"lti/jwks", Jwks), (at + r"lti/login", Login), (at + r"lti/launch", Launch)]
