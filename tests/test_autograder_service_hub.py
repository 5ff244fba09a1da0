"""The submission service on a real JupyterHub (issue 28): ``serve --jupyterhub``.

The unit tests map hub user models to learners and instructors, read the ``[jupyterhub]``
table of service.toml and check that the guide shows the example config as it is. The
integration tests start ``python -m jupyterhub`` (pip's JupyterHub, npm's
configurable-http-proxy: :mod:`tests.hub`) on loopback ports with that example config
(``autograder/service/jupyterhub_config.example.py``), which runs the service as a managed hub
service over a copy of the fixture course, with no roster. Then its users drive it: a
learner signs in at the hub's login page in Chromium, goes through the hub's OAuth to the
service, hands in through the page's file input and reads the feedback. With HTTP
sessions that follow the same redirects with cookies (no Chromium needed): a learner's form
without the hub's XSRF token is refused and with it taken; another learner cannot open
that upload nor the instructor's page; a member of the instructors' group opens the
instructor page and grades.csv, and signs out of the service and the hub. ``python -m
autograder submit`` hands in with a token the learner made at the hub, found in
``$JUPYTERHUB_API_TOKEN``; tokens without the scope are refused. And a learner's server,
started by the hub at sign-in (:mod:`tests.hub_server`, a stand-in for Jupyter's), runs
``submit`` with no token: the example's ``server_token_scopes`` let the server's own token in.
"""
from __future__ import annotations

import csv
import html
import http.cookiejar
import io
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.service.config import (ConfigError, INSTRUCTOR, LEARNER, Person,
                                       ServiceConfig, read_hub)
from autograder.service.auth import Refused
from autograder.commands.submit import multipart
from tests.autograder_fixtures.submissions import COURSE, answered, write
from tests.documentation import documentation
from tests.test_autograder_service import (OFF_BY_ONE, ROOT, roster_course, until,
                                           with_rules)
from tests.helpers import checkout_env

GROUP = "formgrade-course101"  # the example's group
PREFIX = "/services/autograder/"


# ------------------------------------------------------------------------ unit tests

def hub_signin(group: str = "instructors"):
    pytest.importorskip("jupyterhub", reason="jupyterhub is not installed here")
    from jupyterhub.services.auth import HubOAuth
    from autograder.service.auth import HubSignIn
    auth = HubOAuth(api_token="secret", oauth_client_id="service-autograder",
                    api_url="http://127.0.0.1:8081/hub/api", base_url=PREFIX)
    return HubSignIn(group, auth=auth)


def test_hub_users_are_learners_and_the_group_instructors():
    signin = hub_signin("formgrade-course101")
    assert signin.prefix == PREFIX and signin.service_name == "autograder"
    user = {"kind": "user", "name": "alan", "groups": ["nbgrader-course101"]}
    assert signin.of(user) == Person("alan", LEARNER)
    assert signin.of({**user, "groups": ["formgrade-course101"]}) == \
        Person("alan", INSTRUCTOR)
    assert signin.of({**user, "groups": ["formgrade-course1010"]}).role == LEARNER
    assert signin.of({**user, "admin": True}).role == LEARNER  # admin: not an instructor
    assert signin.of(None) is None
    # a service's token is no one's; a hub name that cannot name a folder is refused, saying
    # so (not sent back to the hub's login, which would send it here again)
    with pytest.raises(Refused, match="hub service 'cull-idle'"):
        signin.of({"kind": "service", "name": "cull-idle", "groups": []})
    for name in ("../ada", "ada@example.org/x", "", ".hidden"):
        with pytest.raises(Refused, match="cannot be a student id"):
            signin.of({**user, "name": name})


def test_the_instructors_group_defaults_to_nbgraders_and_is_checked(tmp_path):
    course = roster_course(tmp_path)
    assert read_hub(course, "course101") == "formgrade-course101"
    assert read_hub(course, "") == "instructors"
    (course / "service.toml").write_text('[jupyterhub]\ninstructors_group = "graders"\n')
    assert read_hub(course, "course101") == "graders"
    # the rules ignore the table, and a hub needs no roster
    (course / "roster.toml").unlink()
    config = ServiceConfig.read(course, ["demo"], hub=True, course_id="course101")
    assert (config.people, config.instructors_group) == ({}, "graders")
    with pytest.raises(ConfigError, match="roster.toml is missing"):
        ServiceConfig.read(course, ["demo"])


@pytest.mark.parametrize("text, says", [
    ('[jupyterhub]\ninstructors_group = ""\n', "instructors_group must be the name of a"),
    ('[jupyterhub]\ninstructors_group = ["a"]\n', "instructors_group must be the name of a"),
    ('[jupyterhub]\ninstructors_group = "a/b"\n', "got 'a/b'"),
    ('[jupyterhub]\ninstructor_group = "x"\n', "[jupyterhub]: unknown key(s)"),
    ('jupyterhub = "x"\n', "jupyterhub must be a table"),
])
def test_a_bad_jupyterhub_table_is_a_clear_error(tmp_path, text, says):
    course = roster_course(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        read_hub(course, "course101")


def test_serve_jupyterhub_off_a_hub_says_what_is_missing(tmp_path, capsys, monkeypatch):
    from autograder.commands.cli import main
    for name in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_SERVICE_URL"):
        monkeypatch.delenv(name, raising=False)
    course = roster_course(tmp_path)
    assert main(["serve", "--jupyterhub", "--course", str(course)]) == 2
    err = capsys.readouterr().err
    assert "JUPYTERHUB_API_TOKEN" in err and "c.JupyterHub.services" in err
    assert main(["serve", "--jupyterhub", "--issue-tokens", "--course", str(course)]) == 2
    assert "on a JupyterHub the hub signs people in" in capsys.readouterr().err
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    for name in ("API_URL", "CLIENT_ID", "SERVICE_PREFIX", "SERVICE_URL"):
        monkeypatch.setenv(f"JUPYTERHUB_{name}", "http://127.0.0.1/x/")
    assert main(["serve", "--jupyterhub", "--course", str(course)]) == 2
    assert "has no host and port: give the service a \"url\"" in capsys.readouterr().err
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:1/")
    (course / "service.toml").write_text('[jupyterhub]\ninstructors_group = "a b"\n')
    assert main(["serve", "--jupyterhub", "--course", str(course)]) == 2
    assert "instructors_group must be the name of a JupyterHub group" in \
        capsys.readouterr().err


def test_submit_takes_the_hub_servers_token_or_says_it_has_none(tmp_path, capsys,
                                                               monkeypatch):
    from autograder.commands.cli import main, parser
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "from-the-server")
    assert parser().parse_args(["submit", "nb.ipynb", "--to", "http://h/"]).token == \
        "from-the-server"
    assert parser().parse_args(["submit", "nb.ipynb", "--to", "http://h/", "--token",
                                "mine"]).token == "mine"
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    path = write(tmp_path, "alan", answered())
    assert main(["submit", str(path), "--to", "http://127.0.0.1:9/"]) == 2
    assert "error: no token: give --token" in capsys.readouterr().err


def test_the_example_config_is_what_the_guide_shows():
    example = (ROOT / "autograder" / "service" / "jupyterhub_config.example.py").read_text()
    shown = re.search(r"```python\n(# The submission service on a JupyterHub.*?)```",
                      documentation("guide/jupyterhub.md"), re.S)
    assert shown, "guide/jupyterhub.md shows autograder/service/jupyterhub_config.example.py"
    assert shown.group(1) == example


# ------------------------------------------------------------ a real hub, driven

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    pytest.importorskip("jupyterhub", reason="jupyterhub is not installed here "
                        "(it is pinned in requirements.txt)")
    from tests.hub import Hub, find_proxy
    proxy, why = find_proxy(install=True)
    if proxy is None:
        pytest.skip(f"no configurable-http-proxy for the JupyterHub test: {why}")
    course = with_rules(tmp_path_factory, "hub")
    (course / "roster.toml").unlink()  # the hub says who is who
    with (course / "service.toml").open("a") as rules:
        rules.write(f'[jupyterhub]\ninstructors_group = "{GROUP}"\n')
    running = Hub(tmp_path_factory.mktemp("jupyterhub"), course, proxy, GROUP,
                  instructors=["ada"], learners=["alan", "grace"],
                  extra=["--jobs", "1", "--device", "cpu", "--cell-timeout", "30"])
    running.course = course
    yield running
    running.stop()


class Session:
    """One person's browser without JavaScript: cookies kept, redirects followed."""

    def __init__(self, hub):
        self.hub = hub
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def open(self, path: str, data: bytes = None, headers: dict = None):
        """(status, final URL, body) of a request to the hub."""
        url = path if path.startswith("http") else self.hub.url + path
        request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
        try:
            with self.opener.open(request, timeout=60) as answer:
                return answer.status, answer.url, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.url, error.read().decode()

    def log_in(self, name: str, then: str = "/hub/home") -> None:
        """Sign in at the hub's login page, then go to ``then``: the hub's home page (with
        ``then=""``, the hub's default: it starts the learner's server)."""
        from tests.hub import PASSWORD
        status, _, page = self.open("/hub/login")
        assert status == 200, page
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({"username": name, "password": PASSWORD,
                                       "_xsrf": xsrf}).encode()
        query = "?" + urllib.parse.urlencode({"next": then}) if then else ""
        status, url, page = self.open("/hub/login" + query, form)
        assert status == 200 and "/hub/login" not in url, (status, url, page[-2000:])

    def service(self, path: str = ""):
        return self.open(PREFIX + path)

    def xsrf(self, page: str) -> str:
        return re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)


def poll(chromium, expression: str, timeout: float = 120.0):
    from tests.test_autograder_service_browser import poll as browser_poll
    return browser_poll(chromium, expression, timeout)


@pytest.fixture(scope="module")
def alan(hub, browser, tmp_path_factory):
    """alan, in Chromium: the service's address, the hub's login page, the OAuth, then a
    correct notebook handed in through the page's file input, and its feedback."""
    from tests.test_autograder_service_browser import hand_in
    browser.open(hub.url + PREFIX)
    poll(browser, "location.pathname === '/hub/login' && document.readyState === 'complete'")
    landed = {"login": browser.evaluate("location.href")}
    browser.evaluate(f"""(() => {{
        document.querySelector('input[name=username]').value = 'alan';
        document.querySelector('input[name=password]').value = {json.dumps(
            __import__('tests.hub', fromlist=['PASSWORD']).PASSWORD)};
        document.querySelector('#login_submit').click(); return true; }})()""")
    poll(browser, f"location.pathname === {PREFIX!r} && document.readyState === 'complete'")
    landed["home"] = browser.evaluate("document.body.innerText")
    good = write(tmp_path_factory.mktemp("alan"), "alan", answered())
    landed["queued"] = hand_in(browser, good)
    poll(browser, "document.body.innerText.includes('Download the executed notebook')")
    landed["url"] = browser.evaluate("location.href")
    landed["feedback"] = browser.evaluate("document.body.innerText")
    landed["problems"] = browser.problems(hub.url + PREFIX)
    landed["links"] = browser.evaluate("[...document.querySelectorAll('a')].map(a => a.href)")
    return landed


@pytest.mark.integration
def test_a_learner_signs_in_at_the_hub_and_hands_in_in_the_browser(hub, alan):
    assert "next=" in alan["login"]  # the service sent the browser to the hub's login
    assert "Signed in as alan (learner)" in alan["home"], alan["home"]
    assert any(words in alan["queued"] for words in ("in the queue", "Being graded",
                                                     "points")), alan["queued"]
    assert re.fullmatch(rf"{hub.url}{PREFIX}submissions/[\w-]{{22}}", alan["url"])
    assert "Score: 8/8 points (graded)" in alan["feedback"], alan["feedback"]
    assert alan["problems"] == []
    # every link of the page stays under the service's prefix
    assert alan["links"] and all(link.startswith(hub.url + PREFIX) for link in alan["links"])
    # stored under alan's hub name, as grade's submitted/ layout names students
    assert (hub.course / "service-files" / "uploads" / "alan" / "demo" / "1"
            / "demo.ipynb").is_file()


@pytest.mark.integration
def test_other_learners_and_instructors_through_the_hub(hub):
    grace = Session(hub)
    grace.log_in("grace")
    status, url, home = grace.service()  # the OAuth redirects, followed
    assert status == 200 and url == hub.url + PREFIX, (status, url)
    assert "Signed in as <b>grace</b> (learner)" in home
    # grace's form without the hub's XSRF token: refused, nothing stored; with it: taken
    nb = nbformat.writes(answered(squares=OFF_BY_ONE)).encode()
    body, kind = multipart({"assignment": "demo"}, "notebook", "demo.ipynb", nb)
    status, _, refused = grace.open(PREFIX + "submit", body, {"Content-Type": kind})
    assert status in (401, 403), (status, refused)
    uploads = hub.course / "service-files" / "uploads" / "grace" / "demo"
    before = len(list(uploads.iterdir())) if uploads.is_dir() else 0
    body, kind = multipart({"_xsrf": grace.xsrf(home), "assignment": "demo"}, "notebook",
                           "demo.ipynb", nb)
    action = re.search(r'<form method=post action="([^"]+)" enctype', home).group(1)
    status, url, page = grace.open(html.unescape(action), body, {"Content-Type": kind})
    assert status == 200 and re.fullmatch(rf"{hub.url}{PREFIX}submissions/[\w-]{{22}}", url), \
        (status, url, page[-1500:])
    assert len(list(uploads.iterdir())) == before + 1
    feedback = url.removeprefix(hub.url)
    until(lambda: json.loads(grace.open(feedback + ".json?wait=10")[2])["state"] == "done",
          what="grace's grade")

    anonymous = Session(hub)
    status, url, _ = anonymous.open(feedback)  # not signed in: to the hub's login
    assert "/hub/login" in url, (status, url)
    alan = Session(hub)  # another learner: neither grace's upload nor the instructor's page
    alan.log_in("alan")
    assert alan.service()[0] == 200
    for path in (feedback, feedback + ".json", feedback + "/notebook"):
        status, _, body = alan.open(path)
        assert status == 404 and "5/8" not in body, (path, status)
    for page in ("instructor", "instructor/grades.csv"):
        status, _, body = alan.service(page)
        assert status == 403 and "for instructors" in body

    ada = Session(hub)  # a member of the group
    ada.log_in("ada")
    status, _, page = ada.service("instructor")
    assert status == 200 and "Signed in as <b>ada</b> (instructor)" in page, page[-1500:]
    assert ">grace<" in page and f'href="{PREFIX}instructor/grades.csv"' in page
    status, _, text = ada.service("instructor/grades.csv")
    assert status == 200
    rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(io.StringIO(text))}
    assert float(rows["grace", "demo"]["score"]) == 5.0, text
    assert ada.open(feedback + ".json")[0] == 200  # an instructor sees every upload
    # signing out leaves the service and the hub: the next visit asks for the hub login
    status, url, _ = ada.open(PREFIX + "signout",
                              urllib.parse.urlencode({"_xsrf": ada.xsrf(page)}).encode())
    assert status == 200 and url.startswith(hub.url + "/hub/"), (status, url)
    status, url, _ = ada.service("instructor")
    assert url.startswith(hub.url + "/hub/login"), (status, url)


def hub_token(session: Session, user: str, scopes=None) -> str:
    """A token as the learner makes one at /hub/token (the page's own API call)."""
    status, _, page = session.open("/hub/token")
    assert status == 200, page[-1000:]
    xsrf = re.search(r'xsrf_token: "([^"]+)"', page).group(1)
    request = {"note": "autograder submit", "expires_in": 3600}
    if scopes is not None:
        request["scopes"] = scopes
    status, _, answer = session.open(f"/hub/api/users/{user}/tokens",
                                     json.dumps(request).encode(),
                                     {"Content-Type": "application/json", "X-XSRFToken": xsrf})
    assert status == 201, answer
    return json.loads(answer)["token"]


@pytest.mark.integration
def test_submit_hands_in_with_the_learners_hub_token(hub, tmp_path):
    def attempts() -> int:
        folder = hub.course / "service-files" / "uploads" / "grace" / "demo"
        return len(list(folder.iterdir())) if folder.is_dir() else 0
    before = attempts()
    grace = Session(hub)
    grace.log_in("grace")
    token = hub_token(grace, "grace")
    path = write(tmp_path, "grace", answered())
    env = checkout_env(JUPYTERHUB_API_TOKEN=token)
    done = subprocess.run([sys.executable, "-m", "autograder", "submit", str(path), "--to",
                           hub.url + PREFIX, "--assignment", "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 of 8 points." in done.stdout and "PASS" in done.stdout
    assert f"{hub.url}{PREFIX}submissions/" in done.stdout
    # a token without access to the service (403), and one the hub does not know (401),
    # are refused, saying which scope a token needs
    narrow = hub_token(grace, "grace", scopes=["read:users:name!user"])
    for bad, code in ((narrow, "403"), ("not-a-token", "401")):
        refused = subprocess.run(
            [sys.executable, "-m", "autograder", "submit", str(path), "--to",
             hub.url + PREFIX, "--token", bad], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"error: {code}:" in refused.stderr and \
            "access:services!service=autograder" in refused.stderr, refused.stderr
    assert attempts() == before + 1  # submit's: nothing of the refused ones


@pytest.mark.integration
def test_submit_in_the_learners_server_uses_the_servers_own_token(hub):
    """The example's server_token_scopes: `submit` in alan's server needs no token."""
    nbformat.write(answered(squares=OFF_BY_ONE), str(hub.server_notebook))
    alan = Session(hub)
    alan.log_in("alan", then="")  # the hub starts alan's server, which hands in
    done = json.loads(until(lambda: hub.server_out.is_file() and hub.server_out.read_text(),
                            timeout=300, what="submit in alan's server"))
    assert done["returncode"] == 1, done  # handed in and graded: not every test passed
    assert "5 of 8 points." in done["stdout"], done
    assert "FAIL" in done["stdout"] and "test_squares" in done["stdout"]
