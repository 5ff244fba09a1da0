"""Similarity of hand-ins (``python -m autograder similarity`` and the instructor's page
``/instructor/similarity/ASSIGNMENT``): which learners handed in the most alike answers.

The learners' notebooks are the course's real release of ``ring_allreduce``
(``exercises/ring_allreduce/``) with answers typed in: ada's; bob's, ada's copied with every
name changed, the functions in another order and comments added; cy's and dee's, written
independently; gus's, cy's but with ada's last function copied; eve's and fay's, nothing but the
given code (untouched; a cell of the given code pasted in). bob's copy carries a ``<script>``,
which must show as text. The command runs as an instructor types it, over nbgrader's
``submitted/`` folder and over the service's database; the page is the real service's (its
application over HTTP, its database and sign-in; no graders), where learners hand in with
``POST /submit`` as ``submit`` does and the instructor signs in with their link.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.commands.submit import multipart
from coursebook.service_process import sign_in, tool_env

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "ring_allreduce"
RELEASE = ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
SCRIPT = "<script>alert('copied')</script>"

ADA = '''\
def reduce_scatter(chunks, network):
    """n - 1 steps; afterwards chunks[i][(i + 1) % n] holds the sum of that chunk over all workers."""
    n = len(chunks)
    for step in range(n - 1):
        for sender in range(n):
            receiver = (sender + 1) % n
            piece = (sender - step) % n
            incoming = network.send(sender, receiver, chunks[sender][piece])
            chunks[receiver][piece].add_(incoming)


def all_gather(chunks, network):
    """n - 1 steps; afterwards every worker holds every complete chunk."""
    n = len(chunks)
    for step in range(n - 1):
        for sender in range(n):
            receiver = (sender + 1) % n
            piece = (sender + 1 - step) % n
            incoming = network.send(sender, receiver, chunks[sender][piece])
            chunks[receiver][piece].copy_(incoming)


def ring_allreduce(data, network=None):
    """Leave the sum of the tensors in `data` in every one of them, in place, over a ring."""
    if not data:
        raise ValueError("there is nothing to reduce: the list of tensors is empty")
    workers = len(data)
    if network is None:
        network = RingNetwork([tensor.device for tensor in data])
    with torch.no_grad():
        chunks = [tensor.view(-1).tensor_split(workers) for tensor in data]
        reduce_scatter(chunks, network)
        all_gather(chunks, network)
'''

# ada's, with every name of hers changed, the functions in reverse order and comments added
BOB = f'''\
def ring_allreduce(data, network=None):
    """Leave the sum of the tensors in `data` in every one of them, in place, over a ring."""
    # first check the input
    if not data:
        raise ValueError("there is nothing to reduce: the list of tensors is empty")
    size = len(data)
    if network is None:
        network = RingNetwork([t.device for t in data])
    with torch.no_grad():
        parts = [t.view(-1).tensor_split(size) for t in data]
        reduce_scatter(parts, network)
        all_gather(parts, network)


def all_gather(chunks, network):
    """n - 1 steps; afterwards every worker holds every complete chunk."""
    n = len(chunks)
    for rnd in range(n - 1):
        for src in range(n):
            dst = (src + 1) % n
            k = (src + 1 - rnd) % n
            got = network.send(src, dst, chunks[src][k])
            chunks[dst][k].copy_(got)


def reduce_scatter(chunks, network):
    """n - 1 steps; afterwards chunks[i][(i + 1) % n] holds the sum of that chunk over all workers."""
    n = len(chunks)
    # {SCRIPT}
    for rnd in range(n - 1):
        for src in range(n):
            dst = (src + 1) % n
            k = (src - rnd) % n
            got = network.send(src, dst, chunks[src][k])
            chunks[dst][k].add_(got)
'''

CY = '''\
def _around_the_ring(chunks, network, first, combine):
    count = len(chunks)
    for turn in range(count - 1):
        plan = [(me, (me + 1) % count, (me + first - turn) % count) for me in range(count)]
        for me, right, index in plan:
            combine(chunks[right][index], network.send(me, right, chunks[me][index]))


def reduce_scatter(chunks, network):
    _around_the_ring(chunks, network, 0, lambda held, arrived: held.add_(arrived))


def all_gather(chunks, network):
    _around_the_ring(chunks, network, 1, lambda held, arrived: held.copy_(arrived))


def ring_allreduce(data, network=None):
    if len(data) == 0:
        raise ValueError("ring_allreduce() got an empty list")
    net = network or RingNetwork([x.device for x in data])
    flat = []
    for x in data:
        flat.append(list(torch.tensor_split(x.view(-1), len(data))))
    with torch.no_grad():
        reduce_scatter(flat, net)
        all_gather(flat, net)
'''

DEE = '''\
def reduce_scatter(chunks, network):
    size = len(chunks)
    t = 0
    while t < size - 1:
        outgoing = [(w, (w - t) % size) for w in range(size)]
        arrived = [network.send(w, (w + 1) % size, chunks[w][c]) for w, c in outgoing]
        for (w, c), value in zip(outgoing, arrived):
            chunks[(w + 1) % size][c] += value
        t += 1


def all_gather(chunks, network):
    size = len(chunks)
    for t in range(1, size):
        for w in range(size):
            c = (w - t + 2) % size
            chunks[(w + 1) % size][c][:] = network.send(w, (w + 1) % size, chunks[w][c])


def ring_allreduce(data, network=None):
    if not len(data):
        raise ValueError("empty")
    if network is None:
        devices = []
        for item in data:
            devices.append(item.device)
        network = RingNetwork(devices)
    views = list(map(lambda item: list(item.view(-1).tensor_split(len(data))), data))
    with torch.no_grad():
        reduce_scatter(views, network)
        all_gather(views, network)
'''

# cy's ring passes, with ada's ring_allreduce copied under it: alike, less than bob's copy
GUS = CY[:CY.index("def ring_allreduce")] + ADA[ADA.index("def ring_allreduce"):]


def released() -> nbformat.NotebookNode:
    return nbformat.read(str(RELEASE), as_version=4)


def grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def answered(code: str) -> nbformat.NotebookNode:
    """The release with ``code`` typed into its answer cell."""
    nb = released()
    (cell,) = [c for c in nb.cells if grade_id(c) == "ring_answer"]
    cell.source = code
    return nb


def given_pasted() -> nbformat.NotebookNode:
    """The release untouched but for a cell of the learner's own holding its given code."""
    nb = released()
    (setup,) = [c for c in nb.cells if grade_id(c) == "ring_setup"]
    nb.cells.append(nbformat.v4.new_code_cell(setup.source))
    return nb


def handins() -> dict:
    return {"ada": answered(ADA), "bob": answered(BOB), "cy": answered(CY),
            "dee": answered(DEE), "eve": released(), "fay": given_pasted(),
            "gus": answered(GUS)}


def write_submitted(folder: Path, notebooks: dict) -> Path:
    """nbgrader's layout: FOLDER/<learner>/ring_allreduce/ring_allreduce.ipynb."""
    for learner, nb in notebooks.items():
        place = folder / learner / ASSIGNMENT
        place.mkdir(parents=True)
        nbformat.write(nb, str(place / f"{ASSIGNMENT}.ipynb"))
    return folder


def pair_of(pair: dict) -> frozenset:
    return frozenset(side["learner"] for side in pair["sides"])


def lines_of(pair: dict, learner: str) -> list:
    (side,) = [side for side in pair["sides"] if side["learner"] == learner]
    return [line for cell in side["cells"] for line in cell["lines"]]


def assert_ranked(report: dict) -> None:
    """The copy first, nearly all of both alike; gus's partial copy next; the independent
    answers and the given code far below or nowhere."""
    pairs = report["pairs"]
    scores = {pair_of(pair): pair["score"] for pair in pairs}
    assert pair_of(pairs[0]) == {"ada", "bob"}, scores
    assert all(side["similarity"] > 0.9 for side in pairs[0]["sides"]), pairs[0]
    assert [pair["rank"] for pair in pairs] == list(range(1, len(pairs) + 1))
    assert [pair["score"] for pair in pairs] == sorted(scores.values(), reverse=True)
    for partial in ({"cy", "gus"}, {"ada", "gus"}, {"bob", "gus"}):
        assert 0.3 < scores[frozenset(partial)] < pairs[0]["score"] - 0.3, scores
    for independent in ({"ada", "cy"}, {"ada", "dee"}, {"bob", "cy"}, {"cy", "dee"}):
        assert scores.get(frozenset(independent), 0.0) < 0.2, scores
    assert set(report["nothing_own"]) == {"eve", "fay"}
    assert not [pair for pair in pairs if pair_of(pair) & {"eve", "fay"}], scores
    assert report["learners"] == ["ada", "bob", "cy", "dee", "eve", "fay", "gus"]


def assert_escaped(page: str) -> None:
    """bob's <script> shows as text, as line 29 of his answer cell; no markup of his."""
    assert "<script" not in page.lower()
    assert " 29     # &lt;script&gt;alert(&#x27;copied&#x27;)&lt;/script&gt;\n" in page


def test_the_command_ranks_the_copy_first_without_the_given_code(tmp_path):
    """``similarity`` as an instructor types it, over nbgrader's submitted/ folder."""
    submitted = write_submitted(tmp_path / "submitted", handins())
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "similarity", ASSIGNMENT, "--submitted",
         str(submitted), "--json", str(tmp_path / "alike.json"), "--html",
         str(tmp_path / "alike.html")], cwd=ROOT, env=tool_env(), capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.splitlines()
    assert table[0].startswith(f"Similarity of '{ASSIGNMENT}': 7 learner(s)"), done.stdout
    assert table[2].split()[:6] == ["1", "100", "%", "ada", "100", "%"], done.stdout
    assert table[2].split()[6] == "bob", done.stdout
    assert "No code of their own beyond the given code: eve, fay" in done.stdout
    report = json.loads((tmp_path / "alike.json").read_text())
    assert_ranked(report)
    copy_lines = lines_of(report["pairs"][0], "bob")
    # the stub's lines are given (never compared); bob's copied loop matches ada's
    given = [line["text"] for line in copy_lines if line["given"]]
    assert "def reduce_scatter(chunks, network):" in given and "    n = len(chunks)" in given
    assert not [line for line in copy_lines if line["given"] and line["match"]]
    assert {"text": "            chunks[dst][k].add_(got)", "match": True, "given": False,
            "number": 35} in copy_lines
    page = (tmp_path / "alike.html").read_text()
    assert_escaped(page)
    assert page.index("<td>ada</td>") < page.index("<td>cy</td>")  # the table, ranked
    assert "Signed in as" not in page  # a file: no one's sign-in


def test_the_given_code_alone_scores_nothing():
    """Hand-ins of nothing but the given code (untouched; the given cell pasted into a cell
    of one's own; into the answer cell) share nothing; without leaving out the given code,
    the same hand-ins would be alike: the leaving out is what makes them score nothing."""
    from autograder.layout import Course
    from autograder.service import similarity
    sources = Course.discover(ROOT).source_notebooks(ASSIGNMENT)
    (setup,) = [c for c in released().cells if grade_id(c) == "ring_setup"]
    stub = next(c.source for c in released().cells if grade_id(c) == "ring_answer")
    notebooks = {"eve": released(), "fay": given_pasted(),
                 "hal": answered(setup.source + "\n\n" + stub)}
    handed = [similarity.Handin(learner, tuple(similarity.answer_cells(
        ASSIGNMENT, sources[ASSIGNMENT].graded_view, nb))) for learner, nb in notebooks.items()]
    report = similarity.compare(ASSIGNMENT, handed, similarity.given_code(sources))
    assert (report.alike, report.pairs, report.nothing_own) == (0, (), ("eve", "fay", "hal"))
    unfiltered = similarity.compare(ASSIGNMENT, handed, given=())
    assert {frozenset(side.learner for side in pair.sides) for pair in unfiltered.pairs} >= {
        frozenset({"fay", "hal"})}


# --------------------------------------------------------- the instructor's page, over HTTP

ROSTER = ('instructors = ["ines"]\n'
          'learners = ["ada", "bob", "cy", "dee", "eve", "fay", "gus"]\n')


@contextlib.contextmanager
def serving(course: Path):
    """The service over ``course`` as ``serve`` runs it (its application, on 127.0.0.1 and a
    free port, its database and sign-in), but with no graders: uploads stay queued, and the
    page compares uploads, graded or not. Yields the service, its address and the tokens."""
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from autograder.service.app import Service
    service = Service(course, gradebook=None)
    tokens = {person.id: token for person, token in service.signin.issue()}
    loop = asyncio.new_event_loop()
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(service.application())

    def run() -> None:
        asyncio.set_event_loop(loop)
        server.add_sockets(sockets)
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield service, f"http://127.0.0.1:{sockets[0].getsockname()[1]}", tokens
    finally:
        loop.call_soon_threadsafe(server.stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        service.upload_pool.shutdown()


def hand_in(url: str, token: str, nb) -> int:
    """A learner's upload as ``python -m autograder submit`` sends it; the HTTP status."""
    body, kind = multipart({"assignment": ASSIGNMENT}, "notebook", f"{ASSIGNMENT}.ipynb",
                           nbformat.writes(nb).encode())
    request = urllib.request.Request(f"{url}/submit", data=body, headers={
        "Content-Type": kind, "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


def opened(browser, url: str):
    """(status, headers, text) of a page a browser opens."""
    try:
        with browser.open(url, timeout=120) as page:
            return page.status, page.headers, page.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def browser_signed_in(url: str, token: str):
    """A browser (cookies kept) that signed in with the person's link, as people do."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    sign_in(browser, url, token)
    return browser


@pytest.fixture(scope="module")
def course_with_uploads(tmp_path_factory):
    """The real ring_allreduce assignment in a course of its own, with a roster; every
    learner has handed in through ``POST /submit``, bob twice: his own answer first (dee's
    twin), then the copy of ada's, which is his latest."""
    course = tmp_path_factory.mktemp("similarity") / "course"
    shutil.copytree(ROOT / "solutions" / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    (course / "roster.toml").write_text(ROSTER)
    with serving(course) as (service, url, tokens):
        assert hand_in(url, tokens["bob"], answered(DEE)) == 201
        for learner, nb in handins().items():
            assert hand_in(url, tokens[learner], nb) == 201
        yield course, url, tokens


def test_the_instructor_page_ranks_the_latest_uploads(course_with_uploads):
    course, url, tokens = course_with_uploads
    browser = browser_signed_in(url, tokens["ines"])
    status, _, instructor = opened(browser, f"{url}/instructor")
    assert status == 200
    link = f'<a href="/instructor/similarity/{ASSIGNMENT}">{ASSIGNMENT}</a>'
    assert link in instructor
    status, headers, page = opened(browser, f"{url}/instructor/similarity/{ASSIGNMENT}")
    assert status == 200, page
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none'
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "each learner&#x27;s latest upload" in page and "Signed in as <b>ines</b>" in page
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+) %</td><td>(\w+)</td><td>\d+ %</td>"
                      r"<td>(\w+)</td>", page)
    assert rows[0] == ("1", "100", "ada", "bob"), rows
    assert {frozenset(row[2:]) for row in rows[1:]} == {
        frozenset(pair) for pair in ({"cy", "gus"}, {"ada", "gus"}, {"bob", "gus"})}, rows
    assert "dee" not in {name for row in rows for name in row[2:]}  # bob's first upload: old
    assert "No code of their own beyond the given code: eve, fay." in page
    assert_escaped(page)
    # the command over the service's database compares the same uploads the same way
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "similarity", ASSIGNMENT, "--course", str(course),
         "--db", str(course / "service.db"), "--json", str(course / "alike.json")],
        cwd=ROOT, env=tool_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((course / "alike.json").read_text())
    assert_ranked(report)
    assert [(str(p["rank"]), str(round(100 * p["score"])), *[s["learner"] for s in p["sides"]])
            for p in report["pairs"]] == rows


def test_only_instructors_open_the_page(course_with_uploads):
    """A learner (signed in, or with their token as ``submit`` sends it), a stranger and
    a wrong token are refused, and the refusal shows no one's code."""
    _, url, tokens = course_with_uploads
    address = f"{url}/instructor/similarity/{ASSIGNMENT}"
    learner = browser_signed_in(url, tokens["ada"])
    status, _, page = opened(learner, address)
    assert status == 403 and "This page is for instructors." in page
    assert "network.send" not in page and "bob" not in page
    for headers, refused in (({"Authorization": f"Bearer {tokens['bob']}"}, 403),
                             ({"Authorization": "Bearer not-a-token"}, 401), ({}, 401)):
        status, _, page = opened(urllib.request.build_opener(),
                                 urllib.request.Request(address, headers=headers))
        assert status == refused, (headers, status)
        assert "network.send" not in page and "ada" not in page
    instructor = browser_signed_in(url, tokens["ines"])
    for wrong in ("nope", "..%2Fring_allreduce", "%3Cscript%3E"):
        status, _, page = opened(instructor, f"{url}/instructor/similarity/{wrong}")
        assert status == 404 and "<script" not in page, (wrong, status)


def test_files_a_learner_forged_are_notes_not_code(tmp_path):
    """In submitted/, a notebook that is a link to the instructor's solution is never followed
    and a file that is not a notebook is not read: each is a note, and the rest compared."""
    from autograder.layout import Course
    from autograder.service import similarity
    sources = Course.discover(ROOT).source_notebooks(ASSIGNMENT)
    submitted = write_submitted(tmp_path / "submitted", {"ada": answered(ADA),
                                                         "bob": answered(BOB)})
    for learner in ("yan", "zed"):
        (submitted / learner / ASSIGNMENT).mkdir(parents=True)
    (submitted / "yan" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").symlink_to(
        ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    (submitted / "zed" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text("<script>{not json")
    handed = similarity.submitted_handins(submitted, ASSIGNMENT, sources)
    report = similarity.compare(ASSIGNMENT, handed, similarity.given_code(sources))
    assert [pair_of(pair) for pair in report.as_dict()["pairs"]] == [{"ada", "bob"}]
    (yan,) = [note for note in report.notes if note.startswith("yan:")]
    (zed,) = [note for note in report.notes if note.startswith("zed:")]
    assert "symbolic link" in yan and "not a Jupyter notebook" in zed, report.notes
    assert [h.cells for h in handed if h.learner in ("yan", "zed")] == [(), ()]


def test_without_copydetect_the_command_says_what_to_install(monkeypatch, capsys, tmp_path):
    """An installed package (no service, no copydetect): a sentence, not a traceback."""
    from autograder.commands.cli import main
    monkeypatch.setitem(sys.modules, "copydetect", None)  # an import of it fails
    assert main(["similarity", ASSIGNMENT, "--course", str(ROOT),
                 "--submitted", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: copydetect is not installed") and "requirements.txt" in err


def test_more_given_code_is_left_out_too(tmp_path, capsys):
    """``--given FILE``: had the course given out ada's ring_allreduce, gus's copy of it would
    be given code, and only his own ring passes (cy's) would still match anyone."""
    from autograder.commands.cli import main
    submitted = write_submitted(tmp_path / "submitted", handins())
    given = tmp_path / "handout.py"
    given.write_text(ADA[ADA.index("def ring_allreduce"):])
    assert main(["similarity", ASSIGNMENT, "--course", str(ROOT), "--submitted",
                 str(submitted), "--given", str(given), "--json",
                 str(tmp_path / "alike.json"), "--top", "1"]) == 0
    report = json.loads((tmp_path / "alike.json").read_text())
    assert report["alike"] == 2 and [pair_of(p) for p in report["pairs"]] == [{"ada", "bob"}]
    assert "(the 1 most alike shown)" in capsys.readouterr().out
    assert main(["similarity", ASSIGNMENT, "--course", str(ROOT), "--submitted",
                 str(submitted), "--given", str(tmp_path / "nowhere.py")]) == 2
