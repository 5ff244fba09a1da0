"""A small LMS on 127.0.0.1 for the LTI tests, built on ``lti1p3platform`` (a maintained
LTI 1.3 *platform* library from PyPI): its OIDC login URL, its launch (the id_token it
signs), its token endpoint (it checks the tool's client assertion against the tool's
JWKS), its Assignment and Grade Services and Names and Role Provisioning Services
endpoints, and its check of a deep-linking answer. What is ours is the HTTP glue
(``http.server``), the course (users, a line item per assignment, a gradebook) and the
switches the tests turn: the LMS down, a token tampered with.
"""
from __future__ import annotations

import html
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from lti1p3platform.ltiplatform import LTI1P3PlatformConfAbstract
from lti1p3platform.membership import Context
from lti1p3platform.message_launch import LTIAdvantageMessageLaunchAbstract
from lti1p3platform.oidc_login import OIDCLoginAbstract
from lti1p3platform.registration import Registration
from lti1p3platform.request import Request
from lti1p3platform.score import UpdateScoreStatus
from lti1p3platform.service_connector import (AssignmentsGradesService,
                                              NamesRoleProvisioningService)

ISSUER = "https://lms.example.edu"
CLIENT_ID = "tool-client-7"
DEPLOYMENT = "deployment-1"
CONTEXT = "course-101"
LEARNER_ROLE = "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"
TEACHER_ROLE = "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"


def new_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def public_pem(private_pem: str) -> str:
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class HttpRequest(Request):
    """lti1p3platform's view of one request of ``http.server``."""

    def build_metadata(self, request) -> dict:
        handler, body = request
        address = urllib.parse.urlsplit(handler.path)
        kind = handler.headers.get("Content-Type", "")
        form = dict(urllib.parse.parse_qsl(body.decode())) if "urlencoded" in kind else {}
        return {"method": handler.command, "form_data": form,
                "get_data": dict(urllib.parse.parse_qsl(address.query)),
                "headers": {k: v for k, v in handler.headers.items()}, "content_type": kind,
                "path": address.path, "json": json.loads(body) if "json" in kind else None}


class Lms:
    """The platform: ``url`` once started; ``scores[assignment][user]`` is its gradebook."""

    def __init__(self, users: Dict[str, str], assignments: List[str]):
        """``users``: user id -> role (learner or instructor)."""
        self.users, self.assignments = users, assignments
        self.private_key = new_key_pem()
        self.scores: Dict[str, Dict[str, dict]] = {a: {} for a in assignments}
        self.score_posts: List[dict] = []   # every score the LMS took, in order
        self.refused_posts = 0              # score posts answered 503 while down
        self.tokens_issued = 0              # client-credentials tokens given to the tool
        self.down = False
        self.deep_links: List[dict] = []    # content items of deep-linking answers taken
        self.tamper: Optional[Callable[[dict], dict]] = None  # changes a launch's claims
        self.tool_url = ""
        self.expires_in = 300  # seconds an id_token lasts (negative: expired already)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # the registration of the tool, as an LMS admin fills it in

    def registration(self) -> Registration:
        return (Registration().set_iss(ISSUER).set_client_id(CLIENT_ID)
                .set_deployment_id(DEPLOYMENT)
                .set_oidc_login_url(self.tool_url + "/lti/login")
                .set_launch_url(self.tool_url + "/lti/launch")
                .set_deeplink_launch_url(self.tool_url + "/lti/launch")
                .set_tool_key_set_url(self.tool_url + "/lti/jwks")
                .set_platform_private_key(self.private_key)
                .set_platform_public_key(public_pem(self.private_key)))

    def config(self) -> LTI1P3PlatformConfAbstract:
        registration = self.registration()

        class Config(LTI1P3PlatformConfAbstract):
            def init_platform_config(self, **kwargs) -> None:
                pass

            def get_registration_by_params(self, **kwargs) -> Registration:
                return registration
        return Config()

    def service_toml(self) -> str:
        """The tool's side of the registration: what an instructor writes in service.toml."""
        return ("[[lti.platforms]]\n"
                f'issuer = "{ISSUER}"\nclient_id = "{CLIENT_ID}"\n'
                f'deployment_ids = ["{DEPLOYMENT}"]\n'
                f'auth_login_url = "{self.url}/auth"\nauth_token_url = "{self.url}/token"\n'
                f'key_set_url = "{self.url}/jwks"\n')

    def lineitem(self, assignment: str) -> str:
        return f"{self.url}/lineitems/{assignment}"

    # what the LMS's pages do

    def login_url(self, user: str, message: str) -> str:
        """Where the LMS sends ``user``'s browser to start a launch (the tool's login);
        ``message``: "link:ASSIGNMENT" or "deep-link"."""
        class Login(OIDCLoginAbstract):
            def set_lti_message_hint(self, **kwargs) -> None:
                self._lti_message_hint = kwargs["hint"]

            def get_redirect(self, url: str) -> str:
                return url
        login = Login(None, self.config())
        login.set_lti_message_hint(hint=message)
        if message == "deep-link":
            login.set_deeplinking_launch_url()
        return login.initiate_login(user)

    def launch(self, query: Dict[str, str]) -> dict:
        """The authorization endpoint: the auto-posted form's fields and action."""
        platform = self
        config = self.config()
        if query.get("redirect_uri") != self.tool_url + "/lti/launch":
            raise ValueError(f"redirect_uri {query.get('redirect_uri')!r} is not registered")
        user, hint = query["login_hint"], query.get("lti_message_hint", "")

        class Launch(LTIAdvantageMessageLaunchAbstract):
            def get_preflight_response(self) -> dict:
                return query

            def get_launch_data(self):
                message, state = super().get_launch_data()
                if platform.tamper is not None:
                    message = platform.tamper(dict(message))
                return message, state

            def render_launch_form(self, launch_data, **kwargs) -> dict:
                return launch_data
        launch = Launch(None, config)
        launch.set_id_token_expiration(self.expires_in)
        role = TEACHER_ROLE if self.users[user] == "instructor" else LEARNER_ROLE
        launch.set_user_data(user, [role], full_name=f"User {user}")
        launch.set_launch_context_claim(CONTEXT, context_title="Deep learning performance")
        launch.set_nrps(f"{self.url}/memberships")
        if hint == "deep-link":
            launch.set_dl(f"{self.url}/deep_link_return", title="Add an assignment",
                          extra_data="opaque-42")  # type: ignore
        else:
            assignment = hint.split(":", 1)[1]
            launch.set_resource_link_claim(f"link-{assignment}", title=assignment)
            launch.set_custom_parameters_claim({"assignment": assignment})
            launch.set_ags(f"{self.url}/lineitems", self.lineitem(assignment),
                           allow_creating_lineitems=False)
        return launch.lti_launch()

    # the HTTP glue

    def _handler(self):
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, code: int, body, kind: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.route(b"")

            def do_POST(self) -> None:
                self.route(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def route(self, body: bytes) -> None:
                try:
                    platform._route(self, body)
                except Exception as error:  # the test sees it as the answer
                    self.answer(500, {"error": f"{type(error).__name__}: {error}"})
        return Handler

    def _route(self, handler, body: bytes) -> None:
        path = urllib.parse.urlsplit(handler.path).path
        request = HttpRequest((handler, body))
        config = self.config()
        config.get_registration()
        if path == "/jwks":
            return handler.answer(200, config.get_jwks())
        if path == "/auth":
            data = self.launch(request.get_data)
            form = "".join(f'<input type=hidden name={name} value="{html.escape(data[name])}">'
                           for name in ("id_token", "state"))
            return handler.answer(200, f'<form method=post action="{data["launch_url"]}">'
                                  f"{form}</form>", "text/html")
        if path == "/token":
            self.tokens_issued += 1
            return handler.answer(200, config.get_access_token(request.form_data))
        found = re.fullmatch(r"/lineitems/([\w-]+)/scores", path)
        if found:
            if self.down:
                self.refused_posts += 1
                return handler.answer(503, {"error": "the LMS is <b>down</b> for maintenance"})
            response = Grades(request, config, self, found.group(1)).handle_update_score(
                found.group(1))
            return handler.answer(response.code, {"status": response.message})
        if path == "/memberships":
            response = Roster(request, config, self).handle_get_members()
            return handler.answer(response.code, response.result or {})
        if path == "/deep_link_return":
            self.deep_links += config.validate_deeplinking_resp(request.form_data)
            return handler.answer(200, "<p>Added.</p>", "text/html")
        handler.answer(404, {"error": "no such page"})


class Grades(AssignmentsGradesService):
    """The LMS's gradebook behind lti1p3platform's AGS endpoint (its token check)."""

    def __init__(self, request, config, platform: Lms, assignment: str):
        super().__init__(request, config, f"{platform.url}/lineitems",
                         platform.lineitem(assignment), allow_creating_lineitems=False)
        self.platform = platform

    def update_score(self, line_item_id: str, score) -> UpdateScoreStatus:
        from lti1p3platform.exceptions import LineItemNotFoundException
        if line_item_id not in self.platform.scores:
            raise LineItemNotFoundException("no such line item")
        self.platform.scores[line_item_id][score["userId"]] = score
        self.platform.score_posts.append(dict(score, lineitem=line_item_id))
        return UpdateScoreStatus.SUCCESS

    def find_lineitems(self, **kwargs):
        return {"content": [], "has_next": False}

    def find_lineitem(self, line_item_id):
        return {"id": self.platform.lineitem(line_item_id), "scoreMaximum": 8,
                "label": line_item_id, "resourceId": line_item_id}

    def create_lineitem(self, creation_data):
        raise NotImplementedError("the tool never creates line items")

    update_lineitem = delete_lineitem = create_lineitem

    def get_results(self, line_item_id, **kwargs):
        return {"content": list(self.platform.scores.get(line_item_id, {}).values()),
                "has_next": False}


class Roster(NamesRoleProvisioningService):
    """The course's members behind lti1p3platform's NRPS endpoint."""

    def __init__(self, request, config, platform: Lms):
        super().__init__(request, config, f"{platform.url}/memberships")
        self.platform = platform

    def get_context_by_id(self) -> Context:
        return Context(id=CONTEXT, label="DLP", title="Deep learning performance")

    def get_member_data_page(self, **kwargs):
        members = [{"user_id": user, "name": f"User {user}", "status": "Active",
                    "roles": [TEACHER_ROLE if role == "instructor" else LEARNER_ROLE]}
                   for user, role in sorted(self.platform.users.items())]
        return {"content": members, "has_next": False}
