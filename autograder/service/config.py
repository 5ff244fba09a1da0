"""The submission service's two files in the course folder, read once at start.

``roster.toml`` says who may sign in::

    instructors = ["ada"]
    learners = ["alan", "grace"]

``service.toml`` (optional) sets the rules, for every assignment and per assignment::

    attempts_per_hour = 10          # uploads per learner and assignment in any hour
    counts = "last"                 # which attempt counts: "last" or "best"
    keep_files = 5                  # a learner's last attempts whose notebooks (upload,
                                    # executed copy) are kept; older ones' are removed,
                                    # their scores and feedback kept, the counted one never

    [assignments.demo]
    deadline = 2026-12-01T17:00:00Z # a TOML date-time with its offset
    late = "penalty"                # "refuse" (the default) or "penalty"
    penalty_per_day = 0.1           # fraction of the points lost per day (or part) late
    sync_grades = true              # false: its scores go to the LMS no more (LTI)

    [[assignments.demo.extensions]] # one learner's own deadline and/or uploads an hour
    learner = "alan"
    deadline = 2026-12-04T17:00:00Z # later than the assignment's
    attempts_per_hour = 20

An instructor may grant an extension on the instructor page too (kept in the service's
database); for the same learner and assignment the page's replaces service.toml's.

On a JupyterHub (``serve --jupyterhub``) there is no roster: every hub user is a learner,
and the members of one hub group are instructors. ``service.toml`` may name the group::

    [jupyterhub]
    instructors_group = "formgrade-course101"  # default: formgrade-<course_id>, nbgrader's
                                               # grader group, or "instructors" without an id

With an LMS (LTI 1.3, :mod:`.lti`), ``service.toml`` holds the tool's key and each
platform's registration (``guide/lti.md``)::

    [lti]
    private_key = "lti-key.pem"     # the tool's RSA key (PEM), relative to the course
    [[lti.platforms]]
    issuer = "https://canvas.instructure.com"
    client_id = "10000000000001"
    deployment_ids = ["1:abc"]
    auth_login_url = "https://sso.canvaslms.com/api/lti/authorize_redirect"
    auth_token_url = "https://sso.canvaslms.com/login/oauth2/token"
    key_set_url = "https://sso.canvaslms.com/api/lti/security/jwks"

A mistake in either file is a :class:`ConfigError` whose message names the file and the
key, raised before the service listens.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from autograder.options import (SERVICE_ATTEMPTS_PER_HOUR, SERVICE_COUNTS, SERVICE_KEEP_FILES,
                      SERVICE_LATE)

ROSTER, RULES = "roster.toml", "service.toml"
LEARNER, INSTRUCTOR = "learner", "instructor"
COUNTS = ("last", "best")
LATE = ("refuse", "penalty")
PERSON_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # also a folder name
DAY = timedelta(days=1)
HUB_TABLE = "jupyterhub"
HUB_KEYS = {"instructors_group"}
LTI_TABLE = "lti"
LTI_KEYS = {"private_key", "key_id", "url", "retry_seconds", "retry_max_seconds", "platforms"}
PLATFORM_KEYS = {"issuer", "client_id", "deployment_ids", "auth_login_url", "auth_token_url",
                 "key_set_url"}
# JupyterHub's own rule for group names is loose; this is what a URL path segment and a
# `load_groups` key carry without quoting (nbgrader's formgrade-<course_id> fits)
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,254}$")


class ConfigError(ValueError):
    """A roster or rules file the service cannot start with."""


def _load(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


@dataclass(frozen=True)
class Person:
    id: str
    role: str  # learner or instructor

    @property
    def instructor(self) -> bool:
        return self.role == INSTRUCTOR


def read_roster(course: Path) -> Dict[str, Person]:
    """Everyone who may sign in, by id."""
    path = Path(course) / ROSTER
    if not path.is_file():
        raise ConfigError(f"{path} is missing: list the course's people there, e.g.\n"
                          'instructors = ["ada"]\nlearners = ["alan", "grace"]')
    data = _load(path)
    unknown = set(data) - {"instructors", "learners"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; "
                          "expected instructors and learners")
    people: Dict[str, Person] = {}
    for key, role in (("instructors", INSTRUCTOR), ("learners", LEARNER)):
        ids = data.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ConfigError(f"{path}: {key} must be a list of ids (strings)")
        for person in ids:
            if not PERSON_ID.match(person):
                raise ConfigError(f"{path}: {person!r} in {key} is not a usable id (letters, "
                                  "digits, _ . -, at most 64)")
            if person in people:
                raise ConfigError(f"{path}: {person!r} is listed twice")
            people[person] = Person(person, role)
    if not any(p.instructor for p in people.values()):
        raise ConfigError(f"{path}: no instructors")
    return people


@dataclass(frozen=True)
class Extension:
    """One learner's own deadline and/or uploads an hour for one assignment."""
    learner: str
    deadline: Optional[datetime] = None       # None: the assignment's
    attempts_per_hour: Optional[int] = None   # None: the assignment's
    granted_by: str = ""                      # the instructor who granted it on the page;
    granted: Optional[float] = None           # "" and None: it is service.toml's


@dataclass(frozen=True)
class Rules:
    """How one assignment's uploads are taken and counted."""
    attempts_per_hour: int = SERVICE_ATTEMPTS_PER_HOUR
    counts: str = SERVICE_COUNTS
    deadline: Optional[datetime] = None
    late: str = SERVICE_LATE
    penalty_per_day: float = 0.0
    keep_files: int = SERVICE_KEEP_FILES  # a learner's last attempts whose notebooks are kept
    sync_grades: bool = True  # its counted scores go to the LMS's gradebook (LTI)
    extensions: Tuple[Extension, ...] = ()  # service.toml's, one per learner at most

    def extension(self, learner: str) -> Optional[Extension]:
        """service.toml's extension for ``learner``, if any."""
        return next((e for e in self.extensions if e.learner == learner), None)

    def extended(self, extension: Optional[Extension]) -> "Rules":
        """These rules as they hold for the learner ``extension`` is of."""
        if extension is None:
            return self
        return replace(self, deadline=extension.deadline or self.deadline,
                       attempts_per_hour=extension.attempts_per_hour or self.attempts_per_hour,
                       extensions=())

    def days_late(self, when: datetime) -> int:
        """Whole days (a part counts as one) past the deadline; 0 if on time."""
        if self.deadline is None or when <= self.deadline:
            return 0
        return math.ceil((when - self.deadline) / DAY)

    def penalty(self, score: float, days_late: int) -> float:
        """Points taken off ``score`` for handing in ``days_late`` days late."""
        if days_late <= 0 or self.late != "penalty":
            return 0.0
        return round(min(score, score * self.penalty_per_day * days_late), 6)


KEYS = {"attempts_per_hour", "counts", "deadline", "late", "penalty_per_day", "keep_files",
        "sync_grades"}
EXTENSION_KEYS = {"learner", "deadline", "attempts_per_hour"}


def check_extension(rules: Rules, learner, deadline, attempts) -> Extension:
    """An extension of ``rules`` for ``learner``, checked (ValueError saying what is wrong):
    a later deadline than the assignment's and/or a whole number of uploads an hour.
    service.toml's and the instructor page's are checked here alike."""
    if not isinstance(learner, str) or not PERSON_ID.match(learner):
        raise ValueError(f"learner must be a learner's id (letters, digits, _ . -), "
                         f"got {learner!r}")
    if deadline is None and attempts is None:
        raise ValueError("an extension needs a deadline, attempts_per_hour or both")
    if deadline is not None:
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            raise ValueError(f"deadline must be a date-time with its offset, e.g. "
                             f"2026-12-01T17:00:00Z, got {deadline!r}")
        if rules.deadline is None:
            raise ValueError("the assignment has no deadline to extend")
        deadline = deadline.astimezone(timezone.utc)
        if deadline <= rules.deadline:
            raise ValueError(f"the extension's deadline {deadline:%Y-%m-%d %H:%M %Z} is not "
                             f"after the assignment's ({rules.deadline:%Y-%m-%d %H:%M %Z})")
    if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool)
                                 or attempts < 1):
        raise ValueError(f"attempts_per_hour must be a whole number of 1 or more, "
                         f"got {attempts!r}")
    return Extension(learner, deadline, attempts)


def _extensions(path: Path, assignment: str, entries, rules: Rules) -> Tuple[Extension, ...]:
    where = f"[[assignments.{assignment}.extensions]]"
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: assignments.{assignment}.extensions must be {where} tables")
    found: Dict[str, Extension] = {}
    for number, entry in enumerate(entries, 1):
        here = f"{where} number {number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {here} must be a table")
        unknown = set(entry) - EXTENSION_KEYS
        if unknown:
            raise ConfigError(f"{path}: {here}: unknown key(s) {sorted(unknown)}; expected "
                              f"learner and deadline and/or attempts_per_hour")
        try:
            extension = check_extension(rules, entry.get("learner"), entry.get("deadline"),
                                        entry.get("attempts_per_hour"))
        except ValueError as error:
            raise ConfigError(f"{path}: {here}: {error}") from None
        if extension.learner in found:
            raise ConfigError(f"{path}: {where}: two extensions for {extension.learner!r}")
        found[extension.learner] = extension
    return tuple(found.values())


def _rules(path: Path, where: str, data: dict, base: Rules) -> Rules:
    unknown = set(data) - KEYS
    if unknown:
        raise ConfigError(f"{path}: {where}: unknown key(s) {sorted(unknown)}; "
                          f"expected some of {sorted(KEYS)}")
    values = dict(base.__dict__)
    values.update(data)
    attempts = values["attempts_per_hour"]
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ConfigError(f"{path}: {where}: attempts_per_hour must be a whole number of 1 "
                          f"or more, got {attempts!r}")
    keep = values["keep_files"]
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ConfigError(f"{path}: {where}: keep_files must be a whole number of 1 or more "
                          f"(the attempt that counts is kept besides), got {keep!r}")
    if values["counts"] not in COUNTS:
        raise ConfigError(f"{path}: {where}: counts must be one of {COUNTS}, "
                          f"got {values['counts']!r}")
    if values["late"] not in LATE:
        raise ConfigError(f"{path}: {where}: late must be one of {LATE}, got {values['late']!r}")
    penalty = values["penalty_per_day"]
    if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) \
            or not 0 <= penalty <= 1:
        raise ConfigError(f"{path}: {where}: penalty_per_day must be a fraction between 0 "
                          f"and 1, got {penalty!r}")
    deadline = values["deadline"]
    if deadline is not None:
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            raise ConfigError(f"{path}: {where}: deadline must be a TOML date-time with its "
                              f"offset, e.g. 2026-12-01T17:00:00Z, got {deadline!r}")
        deadline = deadline.astimezone(timezone.utc)
    if not isinstance(values["sync_grades"], bool):
        raise ConfigError(f"{path}: {where}: sync_grades must be true or false, "
                          f"got {values['sync_grades']!r}")
    if values["late"] == "penalty" and deadline is None and "late" in data:
        raise ConfigError(f"{path}: {where}: late = \"penalty\" needs a deadline")
    return Rules(attempts_per_hour=attempts, counts=values["counts"], deadline=deadline,
                 late=values["late"], penalty_per_day=float(penalty), keep_files=keep,
                 sync_grades=values["sync_grades"])


def read_rules(course: Path, assignments: List[str]) -> Tuple[Rules, Dict[str, Rules]]:
    """The rules for every assignment (the defaults, and each assignment's own)."""
    path = Path(course) / RULES
    data = _load(path) if path.is_file() else {}
    data.pop(HUB_TABLE, None)  # read by read_hub
    data.pop(LTI_TABLE, None)  # read by read_lti
    per = data.pop("assignments", {})
    if not isinstance(per, dict):
        raise ConfigError(f"{path}: [assignments.NAME] tables expected")
    default = _rules(path, "top level", data, Rules())
    rules = {}
    for name, table in per.items():
        if name not in assignments:
            raise ConfigError(f"{path}: [assignments.{name}]: no such assignment in the "
                              f"course (it has {', '.join(assignments) or 'none'})")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: assignments.{name} must be a table")
        entries = table.pop("extensions", [])
        rules[name] = _rules(path, f"[assignments.{name}]", table, default)
        rules[name] = replace(rules[name],
                              extensions=_extensions(path, name, entries, rules[name]))
    return default, {name: rules.get(name, default) for name in assignments}


def default_instructors_group(course_id: str) -> str:
    """nbgrader's name for a course's graders on a hub (its docs' ``formgrade-<course_id>``),
    or ``instructors`` for a course without an id."""
    return f"formgrade-{course_id}" if course_id else "instructors"


def _table(path: Path, name: str, keys) -> Optional[dict]:
    """The table ``[name]`` of service.toml at ``path`` (None when absent), with no key but
    ``keys``."""
    table = (_load(path) if path.is_file() else {}).get(name)
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {name} must be a table ([{name}])")
    unknown = set(table) - set(keys)
    if unknown:
        raise ConfigError(f"{path}: [{name}]: unknown key(s) {sorted(unknown)}; expected some "
                          f"of {sorted(keys)}")
    return table


def read_hub(course: Path, course_id: str = "") -> str:
    """The hub group whose members are instructors (``[jupyterhub]`` of service.toml)."""
    path = Path(course) / RULES
    table = _table(path, HUB_TABLE, HUB_KEYS) or {}
    group = table.get("instructors_group", default_instructors_group(course_id))
    if not isinstance(group, str) or not GROUP_NAME.match(group):
        raise ConfigError(f"{path}: [{HUB_TABLE}]: instructors_group must be the name of a "
                          "JupyterHub group (letters, digits, _ . @ + -, e.g. "
                          f'"formgrade-course101"), got {group!r}')
    return group


@dataclass(frozen=True)
class Platform:
    """One LMS registration of the tool (what the LMS's admin page shows for it)."""
    issuer: str           # the platform's "iss"
    client_id: str        # the tool's id at the platform: the id_token's "aud"
    deployment_ids: Tuple[str, ...]  # the deployments (installs) of the tool it may launch
    auth_login_url: str   # the platform's OIDC authorization endpoint
    auth_token_url: str   # its OAuth 2 token endpoint (for grades and the roster)
    key_set_url: str      # its public keys (JWKS)


@dataclass(frozen=True)
class LtiConfig:
    """The ``[lti]`` table of service.toml: the tool's key and the platforms it trusts."""
    private_key: Path     # the tool's RSA private key, PEM
    platforms: Tuple[Platform, ...]
    key_id: str = ""      # the key's "kid" in the tool's JWKS (default: its thumbprint)
    url: str = ""         # the service's public address (default: the one a request came to)
    retry_seconds: float = 30.0      # first wait before a score is sent again
    retry_max_seconds: float = 3600.0  # longest wait between tries

    def platform(self, issuer: str, client_id: Optional[str] = None) -> Optional[Platform]:
        """The registration of ``issuer`` (and ``client_id``, when given): None if unknown."""
        for platform in self.platforms:
            if platform.issuer == issuer and client_id in (None, platform.client_id):
                return platform
        return None


def _https_or_loopback(url) -> bool:
    from urllib.parse import urlparse
    parsed = urlparse(url) if isinstance(url, str) else None
    return bool(parsed and parsed.netloc and (parsed.scheme == "https" or (
        parsed.scheme == "http" and parsed.hostname in ("127.0.0.1", "localhost", "::1"))))


def read_lti(course: Path) -> Optional[LtiConfig]:
    """The ``[lti]`` table of service.toml, checked; None when there is none."""
    path = Path(course) / RULES
    table = _table(path, LTI_TABLE, LTI_KEYS)
    if table is None:
        return None
    where = f"{path}: [{LTI_TABLE}]"
    key = table.get("private_key")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}: private_key must name the tool's RSA key file (PEM), e.g. "
                          '"lti-key.pem"; make one with `openssl genpkey -algorithm RSA '
                          "-pkeyopt rsa_keygen_bits:2048 -out lti-key.pem`")
    key_path = (Path(course) / key).resolve()
    if not key_path.is_file():
        raise ConfigError(f"{where}: private_key {key_path} is missing")
    for name in ("retry_seconds", "retry_max_seconds"):
        value = table.get(name, 1.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{where}: {name} must be a number of seconds above 0, "
                              f"got {value!r}")
    url = table.get("url", "")
    if url and not _https_or_loopback(url):
        raise ConfigError(f"{where}: url must be the service's https:// address, got {url!r}")
    platforms = []
    entries = table.get("platforms", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: no [[lti.platforms]]: register at least one LMS")
    for number, entry in enumerate(entries, 1):
        here = f"{path}: [[lti.platforms]] number {number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{here} must be a table")
        unknown, missing = set(entry) - PLATFORM_KEYS, PLATFORM_KEYS - set(entry)
        if unknown or missing:
            raise ConfigError(f"{here}: unknown key(s) {sorted(unknown)}, missing "
                              f"{sorted(missing)}; expected {sorted(PLATFORM_KEYS)}")
        deployments = entry["deployment_ids"]
        if not isinstance(deployments, list) or not deployments or \
                not all(isinstance(d, str) and d for d in deployments):
            raise ConfigError(f"{here}: deployment_ids must be a list of the deployment ids "
                              "the LMS shows")
        for name in ("issuer", "client_id"):
            if not isinstance(entry[name], str) or not entry[name]:
                raise ConfigError(f"{here}: {name} must be a string")
        for name in ("auth_login_url", "auth_token_url", "key_set_url"):
            if not _https_or_loopback(entry[name]):
                raise ConfigError(f"{here}: {name} must be an https:// address, got "
                                  f"{entry[name]!r}")
        platforms.append(Platform(entry["issuer"], entry["client_id"], tuple(deployments),
                                  entry["auth_login_url"], entry["auth_token_url"],
                                  entry["key_set_url"]))
    if len({(p.issuer, p.client_id) for p in platforms}) != len(platforms):
        raise ConfigError(f"{where}: the same issuer and client_id are registered twice")
    return LtiConfig(private_key=key_path, platforms=tuple(platforms),
                     key_id=str(table.get("key_id", "")), url=str(url).rstrip("/"),
                     retry_seconds=float(table.get("retry_seconds", 30.0)),
                     retry_max_seconds=float(table.get("retry_max_seconds", 3600.0)))


@dataclass
class ServiceConfig:
    """Everything the service reads from the course folder.

    With a roster (standalone), ``people`` is everyone who may sign in; on a JupyterHub,
    ``people`` is empty (the hub says who is asking) and ``instructors_group`` is set."""
    course: Path
    people: Dict[str, Person]
    rules: Dict[str, Rules] = field(default_factory=dict)
    instructors_group: Optional[str] = None
    lti: Optional[LtiConfig] = None

    @classmethod
    def read(cls, course: Path, assignments: List[str], hub: bool = False,
             course_id: str = "") -> "ServiceConfig":
        course = Path(course)
        people = {} if hub else read_roster(course)
        _, rules = read_rules(course, assignments)
        group = read_hub(course, course_id) if hub else None
        lti = read_lti(course)
        if lti is not None and hub:
            raise ConfigError(f"{course / RULES}: [{LTI_TABLE}]: LTI sign-in is for the "
                              "standalone service, not serve --jupyterhub")
        if not hub and lti is None:  # (a hub's or an LMS's learners are not listed here)
            learners = {p.id for p in people.values() if not p.instructor}
            for name, rule in rules.items():
                for extension in rule.extensions:
                    if extension.learner not in learners:
                        raise ConfigError(
                            f"{course / RULES}: [[assignments.{name}.extensions]]: "
                            f"{extension.learner!r} is not a learner of {ROSTER}")
        return cls(course=course, people=people, rules=rules, instructors_group=group, lti=lti)
