"""LTI 1.3 and LTI Advantage: the service as a tool an LMS (Canvas, Moodle...) launches.

The protocol, on PyJWT (with ``cryptography`` for RS256; ``guide/lti.md`` says why not a
whole LTI library):

* **Login** (OIDC third-party initiated login): the LMS sends ``iss``, ``login_hint``,
  ``target_link_uri`` (and ``client_id``, ``lti_message_hint``) to ``/lti/login``; the tool
  keeps a random ``state`` and ``nonce`` (the state's SHA-256 in the database, the state
  itself in the browser's cookie) and sends the browser to the platform's
  ``auth_login_url``.
* **Launch**: the platform POSTs an ``id_token`` and the ``state`` to ``/lti/launch``. The
  state must be the browser's own and unused; the token is checked against the platform's
  JWKS (signature RS256, ``iss``, ``aud``/``azp``, ``exp``/``iat``, the login's ``nonce``,
  used once), then its deployment, version and message type.
* **Who**: (issuer, deployment, ``sub``) is mapped once to a person id ``lti-`` + 16 hex
  digits of its SHA-256 (:func:`person_id`), kept in ``lti_people``: the id of grades.csv,
  the gradebook and the uploads.
* **Grades** (Assignment and Grade Services): a learner's counted score of an assignment
  goes into an outbox in the database when it changes (:meth:`Tool.score_changed`); the
  :class:`Outbox` thread posts it to the line item of the learner's link with a
  client-credentials token, and tries again with a doubling wait while the LMS fails. A
  score of an assignment with ``sync_grades = false`` is never posted.
* **Deep linking**: an instructor's ``LtiDeepLinkingRequest`` shows the course's
  assignments; the chosen one goes back as a signed ``LtiDeepLinkingResponse``.
* **Roster** (Names and Role Provisioning Services): :meth:`Tool.members`.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Dict, List, Optional, Tuple

import jwt
from jwt.algorithms import RSAAlgorithm

from autograder.service.config import INSTRUCTOR, LEARNER, LtiConfig, Platform

CLAIM = "https://purl.imsglobal.org/spec/lti/claim/"
AGS = "https://purl.imsglobal.org/spec/lti-ags/claim/endpoint"
AGS_SCORE = "https://purl.imsglobal.org/spec/lti-ags/scope/score"
NRPS = "https://purl.imsglobal.org/spec/lti-nrps/claim/namesroleservice"
NRPS_SCOPE = "https://purl.imsglobal.org/spec/lti-nrps/scope/contextmembership.readonly"
DL = "https://purl.imsglobal.org/spec/lti-dl/claim/"
RESOURCE_LINK, DEEP_LINKING = "LtiResourceLinkRequest", "LtiDeepLinkingRequest"
# roles that make an LMS user an instructor here (the LIS context roles, and their short forms)
TEACHING_ROLES = ("membership#Instructor", "membership#ContentDeveloper",
                  "membership#Administrator", "membership/Instructor#TeachingAssistant")
LOGIN_SECONDS = 600.0  # a login's state and nonce last this long
LEEWAY = 60            # seconds of clock difference allowed on exp and iat
HTTP_TIMEOUT = 20
STATE_COOKIE = "lti-state"


class LaunchRefused(ValueError):
    """A login or launch the tool does not accept; the message says why, for the page."""


def person_id(issuer: str, deployment: str, sub: str) -> str:
    """The person id of an LMS user: stable, a valid folder name, and naming no one."""
    key = json.dumps([issuer, deployment, sub]).encode()
    return "lti-" + hashlib.sha256(key).hexdigest()[:16]


def role_of(roles: List[str]) -> str:
    """Instructor for a teaching role of the course (context), learner otherwise."""
    return INSTRUCTOR if any(str(role).endswith(TEACHING_ROLES) or role in (
        "Instructor", "Administrator") for role in roles) else LEARNER


@dataclass(frozen=True)
class Launch:
    """A checked launch: who, from where, and what for."""
    platform: Platform
    deployment: str
    sub: str
    role: str
    name: str
    message_type: str
    assignment: str          # the custom parameter "assignment" ("" for deep linking)
    lineitem: str            # the AGS line item of the link ("" without)
    memberships: str         # the NRPS service of the course ("" without)
    deep_link_return: str    # where a deep-linking answer goes
    deep_link_data: object   # the opaque "data" the answer must carry back (None: none)


class Tool:
    """The tool's side of LTI: its key, its platforms, logins, launches and LTI services."""

    def __init__(self, config: LtiConfig, store, rules: Dict[str, object]):
        self.config, self.store, self.rules = config, store, rules
        pem = config.private_key.read_bytes()
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        self.private_key = load_pem_private_key(pem, password=None)
        public = json.loads(RSAAlgorithm.to_jwk(self.private_key.public_key()))
        self.key_id = config.key_id or jwt.PyJWK(public, "RS256").key_id or \
            hashlib.sha256(pem).hexdigest()[:16]
        self.jwks = {"keys": [dict(public, kid=self.key_id, alg="RS256", use="sig")]}
        self._key_sets: Dict[str, jwt.PyJWKClient] = {}
        self._tokens: Dict[Tuple[str, str, str], Tuple[str, float]] = {}
        self._lock = threading.Lock()

    # login and launch

    def login(self, params: Dict[str, str], redirect_uri: str) -> Tuple[str, str]:
        """The third-party initiated login: (the platform's authorization URL to send the
        browser to, the state for the browser's cookie)."""
        issuer = params.get("iss", "")
        platform = self.config.platform(issuer, params.get("client_id") or None)
        if platform is None:
            raise LaunchRefused(f"this service is not registered with the LMS {issuer!r}: "
                                "ask your instructor")
        if not params.get("login_hint") or not params.get("target_link_uri"):
            raise LaunchRefused("the LMS's login request lacks login_hint or target_link_uri")
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.store.start_login(state, nonce, platform.issuer, platform.client_id,
                               LOGIN_SECONDS)
        query = {"scope": "openid", "response_type": "id_token", "response_mode": "form_post",
                 "prompt": "none", "client_id": platform.client_id,
                 "redirect_uri": redirect_uri, "login_hint": params["login_hint"],
                 "state": state, "nonce": nonce}
        if params.get("lti_message_hint"):
            query["lti_message_hint"] = params["lti_message_hint"]
        separator = "&" if "?" in platform.auth_login_url else "?"
        return platform.auth_login_url + separator + urllib.parse.urlencode(query), state

    def key_set(self, platform: Platform) -> jwt.PyJWKClient:
        with self._lock:
            if platform.key_set_url not in self._key_sets:  # keeps the keys for 5 minutes
                self._key_sets[platform.key_set_url] = jwt.PyJWKClient(
                    platform.key_set_url, cache_keys=True, lifespan=300, timeout=HTTP_TIMEOUT)
            return self._key_sets[platform.key_set_url]

    def launch(self, id_token: str, state: str, browser_state: Optional[str]) -> Launch:
        """Check a launch (the platform's POST to ``/lti/launch``); :class:`LaunchRefused`
        says why not."""
        if not state or not browser_state or not secrets.compare_digest(state, browser_state):
            raise LaunchRefused("this launch was not started in this browser (its state does "
                                "not match): open the assignment from the LMS again")
        login = self.store.end_login(state)
        if login is None:
            raise LaunchRefused("this launch was used already or is too old: open the "
                                "assignment from the LMS again")
        nonce, issuer, client_id = login
        platform = self.config.platform(issuer, client_id)
        if platform is None:  # registered when the login began, no more
            raise LaunchRefused(f"the LMS {issuer!r} is not registered here any more")
        try:
            key = self.key_set(platform).get_signing_key_from_jwt(id_token)
            claims = jwt.decode(id_token, key.key, algorithms=["RS256"], audience=client_id,
                                issuer=issuer, leeway=LEEWAY,
                                options={"require": ["exp", "iat", "iss", "aud", "sub",
                                                     "nonce"]})
        except jwt.ExpiredSignatureError:
            raise LaunchRefused("the LMS's launch has expired: open the assignment from the "
                                "LMS again") from None
        except jwt.InvalidAudienceError:
            raise LaunchRefused("the launch was meant for another tool (its audience is not "
                                "this service's client id)") from None
        except jwt.InvalidIssuerError:
            raise LaunchRefused("the launch comes from another LMS than the login") from None
        except (jwt.PyJWTError, ValueError) as error:
            raise LaunchRefused(f"the launch's signature or content is not valid "
                                f"({type(error).__name__}): it is refused") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != client_id:
            raise LaunchRefused("the launch names several tools and not this one as its azp")
        if claims["iat"] > time.time() + LEEWAY:
            raise LaunchRefused("the launch was issued in the future: check the LMS's clock")
        if not secrets.compare_digest(str(claims["nonce"]), nonce) or \
                not self.store.use_nonce(nonce, claims["exp"] + LEEWAY):
            raise LaunchRefused("this launch was used already (its nonce): open the "
                                "assignment from the LMS again")
        deployment = str(claims.get(CLAIM + "deployment_id", ""))
        if deployment not in platform.deployment_ids:
            raise LaunchRefused(f"the LMS's deployment {deployment!r} of this service is not "
                                "registered here: ask your instructor")
        if claims.get(CLAIM + "version") != "1.3.0":
            raise LaunchRefused("only LTI 1.3.0 launches are accepted")
        kind = claims.get(CLAIM + "message_type")
        if kind not in (RESOURCE_LINK, DEEP_LINKING):
            raise LaunchRefused(f"this service does not take {kind!r} messages")
        custom = claims.get(CLAIM + "custom") or {}
        ags = claims.get(AGS) or {}
        deep = claims.get(DL + "deep_linking_settings") or {}
        name = claims.get("name") or " ".join(
            filter(None, (claims.get("given_name"), claims.get("family_name"))))
        return Launch(platform=platform, deployment=deployment, sub=str(claims["sub"]),
                      role=role_of(claims.get(CLAIM + "roles") or []), name=str(name or ""),
                      message_type=kind, assignment=str(custom.get("assignment", "")),
                      lineitem=str(ags.get("lineitem", "")) if AGS_SCORE in
                      (ags.get("scope") or []) else "",
                      memberships=str((claims.get(NRPS) or {}).get(
                          "context_memberships_url", "")),
                      deep_link_return=str(deep.get("deep_link_return_url", "")),
                      deep_link_data=deep.get("data"))

    def sign_in(self, launch: Launch) -> str:
        """The person id of the launch's user (made at their first launch); their link to the
        assignment's line item recorded."""
        person = self.store.lti_person(launch.platform.issuer, launch.deployment, launch.sub,
                                       launch.role, launch.name, person_id)
        if launch.assignment and launch.lineitem:
            self.store.set_lti_link(person, launch.assignment, launch.platform.issuer,
                                    launch.platform.client_id, launch.sub, launch.lineitem)
        if launch.memberships:
            self.store.set_lti_roster(launch.memberships, launch.platform.issuer,
                                      launch.platform.client_id, launch.deployment)
        return person

    def deep_link_response(self, launch: Launch, assignment: str, title: str,
                           max_score: float, launch_url: str) -> str:
        """The signed ``LtiDeepLinkingResponse`` that puts ``assignment`` into the course: a
        link that launches it (custom ``assignment``) with a line item for its points."""
        now = int(time.time())
        item = {"type": "ltiResourceLink", "title": title, "url": launch_url,
                "custom": {"assignment": assignment},
                "lineItem": {"scoreMaximum": max_score, "label": title,
                             "resourceId": assignment}}
        claims = {"iss": launch.platform.client_id, "aud": launch.platform.issuer,
                  "iat": now, "exp": now + 600, "nonce": secrets.token_urlsafe(16),
                  CLAIM + "deployment_id": launch.deployment,
                  CLAIM + "message_type": "LtiDeepLinkingResponse",
                  CLAIM + "version": "1.3.0", DL + "content_items": [item]}
        if launch.deep_link_data is not None:
            claims[DL + "data"] = launch.deep_link_data
        return self.sign(claims)

    def sign(self, claims: dict) -> str:
        return jwt.encode(claims, self.private_key, algorithm="RS256",
                          headers={"kid": self.key_id})

    # LTI Advantage services: a client-credentials token, then the service

    def access_token(self, platform: Platform, scopes: str) -> str:
        """A bearer token of the platform for ``scopes`` (kept until a minute before its end)."""
        key = (platform.issuer, platform.client_id, scopes)
        with self._lock:
            token, until = self._tokens.get(key, ("", 0.0))
        if token and until > time.time():
            return token
        now = int(time.time())
        assertion = self.sign({"iss": platform.client_id, "sub": platform.client_id,
                               "aud": platform.auth_token_url, "iat": now, "exp": now + 300,
                               "jti": secrets.token_urlsafe(16)})
        form = {"grant_type": "client_credentials",
                "client_assertion_type":
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                "client_assertion": assertion, "scope": scopes}
        answer = http_json("POST", platform.auth_token_url,
                           urllib.parse.urlencode(form).encode(),
                           {"Content-Type": "application/x-www-form-urlencoded"})[1]
        token = answer.get("access_token") if isinstance(answer, dict) else None
        if not token:
            raise OSError(f"the LMS's token endpoint gave no access_token: {answer!r:.200}")
        lifetime = float(answer.get("expires_in", 3600))
        with self._lock:
            self._tokens[key] = (token, time.time() + max(0.0, lifetime - 60))
        return token

    def post_score(self, person: str, assignment: str, score: float, max_score: float,
                   created: float) -> None:
        """Send one score to the line item of ``person``'s link (OSError if it fails)."""
        link = self.store.lti_link(person, assignment)
        if link is None:
            raise OSError("no LMS link with a line item for this learner and assignment")
        issuer, client_id, sub, lineitem = link
        platform = self.config.platform(issuer, client_id)
        if platform is None:
            raise OSError(f"the LMS {issuer!r} is registered no more")
        token = self.access_token(platform, AGS_SCORE)
        stamp = datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")
        body = {"userId": sub, "scoreGiven": score, "scoreMaximum": max_score,
                "timestamp": stamp, "activityProgress": "Completed",
                "gradingProgress": "FullyGraded"}
        address = urllib.parse.urlsplit(lineitem)
        scores = urllib.parse.urlunsplit(address._replace(path=address.path.rstrip("/") +
                                                          "/scores"))
        try:
            http_json("POST", scores, json.dumps(body).encode(),
                      {"Content-Type": "application/vnd.ims.lis.v1.score+json",
                       "Authorization": f"Bearer {token}"})
        except OSError:
            self.forget_token(platform)  # revoked, or the LMS restarted: a new one next time
            raise

    def forget_token(self, platform: Platform) -> None:
        with self._lock:
            for key in [k for k in self._tokens if k[:2] == (platform.issuer,
                                                             platform.client_id)]:
                del self._tokens[key]

    def members(self) -> List[dict]:
        """The course's members from each roster service (NRPS) the LMS offered at a launch:
        dicts with the person id they have here, their user id there, roles, name, status."""
        found = []
        for issuer, client_id, deployment, url in self.store.roster_services():
            platform = self.config.platform(issuer, client_id)
            if platform is None:
                continue
            token = self.access_token(platform, NRPS_SCOPE)
            while url:
                headers, page = http_json(
                    "GET", url, None,
                    {"Accept": "application/vnd.ims.lti-nrps.v2.membershipcontainer+json",
                     "Authorization": f"Bearer {token}"})
                for member in page.get("members", []):
                    sub = str(member.get("user_id", ""))
                    found.append({"person": person_id(issuer, deployment, sub),
                                  "user_id": sub, "role": role_of(member.get("roles", [])),
                                  "name": str(member.get("name", "")),
                                  "status": str(member.get("status", "Active"))})
                url = next_link(headers.get("Link", ""))
        return found

    # the grade outbox

    def score_changed(self, person: str, assignment: str, score: float,
                      max_score: float) -> None:
        """A learner's counted score of ``assignment`` is now ``score``: into the outbox,
        once per change, if they came from an LMS link with a line item."""
        if self.store.lti_link(person, assignment) is None:
            return
        if not self.rules[assignment].sync_grades:
            return  # closed for syncing: nothing is queued, nothing sent
        self.store.queue_score(person, assignment, score, max_score)

    def wait_after(self, tries: int) -> float:
        """Seconds before the next try after ``tries`` failed ones: doubling, capped."""
        return min(self.config.retry_max_seconds, self.config.retry_seconds * 2 ** (tries - 1))


def next_link(header: str) -> str:
    """The ``rel="next"`` address of an HTTP Link header, or ""."""
    for part in header.split(","):
        address, _, params = part.partition(";")
        if "rel=\"next\"" in params.replace(" ", "") or "rel=next" in params.replace(" ", ""):
            return address.strip().strip("<>")
    return ""


def http_json(method: str, url: str, body: Optional[bytes], headers: dict):
    """(headers, JSON or None) of one request; OSError when the answer is not 2xx."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:
            data = answer.read()
            return answer.headers, (json.loads(data) if data.strip() else None)
    except urllib.error.HTTPError as error:
        raise OSError(f"{method} {url}: HTTP {error.code} {error.read()[:200]!r}") from None
    except ValueError as error:
        raise OSError(f"{method} {url}: not JSON ({error})") from None


class Outbox:
    """A thread that posts the outbox's due scores, in order, until stopped; a failed post
    waits :meth:`Tool.wait_after` and is tried again (the outbox is in the database, so a
    restart goes on where it stopped)."""

    def __init__(self, tool: Tool, log=print):
        self.tool, self.log = tool, log
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="lti-outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def send_due(self) -> int:
        """Post every due score once; how many were sent."""
        sent = 0
        store = self.tool.store
        for score_id, person, assignment, score, max_score, created, tries in store.due_scores():
            if self._stop.is_set():
                break
            rules = self.tool.rules.get(assignment)
            if rules is None or not rules.sync_grades:
                store.score_done(score_id, "closed")  # closed after it was queued: never sent
                continue
            try:
                self.tool.post_score(person, assignment, score, max_score, created)
            except OSError as error:
                store.score_failed(score_id, str(error), self.tool.wait_after(tries + 1))
                self.log(f"LTI: the score of {person} for {assignment} was not taken "
                         f"({error}); trying again later")
                continue
            store.score_done(score_id, "sent")
            sent += 1
        return sent

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.send_due()
                due = self.tool.store.next_score_due()
            except Exception as error:  # the database: try again in a while
                self.log(f"LTI: the outbox could not be read ({error})")
                due = time.time() + self.tool.config.retry_seconds
            wait = 3600.0 if due is None else max(0.05, due - time.time())
            self._wake.wait(wait)
            self._wake.clear()
