"""The submission service's database (SQLite): sign-in tokens, browsers' sessions,
submissions, the queue, the speed leaderboard's display names.

The queue *is* the ``submissions`` table: a row is ``queued`` from the moment its upload
is acknowledged, ``grading`` while a grader has it, ``done`` once its result is committed.
A service killed mid-grading finds its ``grading`` rows at the next start and queues them
again (:meth:`Store.requeue_interrupted`), so every acknowledged upload is graded, and its
result committed, exactly once (``gradings`` counts the commits).

Which queued row goes next is :func:`fair_order`: the oldest upload of the learner served
least recently, so one learner's twenty attempts do not hold back another's first.

The schema has a version (SQLite's ``PRAGMA user_version``, :data:`SCHEMA_VERSION`). A
database made by an earlier service is brought forward when it is opened
(:data:`MIGRATIONS`, in one transaction, after a copy of the file is kept beside it);
one made by a later service is refused with :class:`DatabaseError`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from autograder.feedback import shown_tests
from autograder.options import SERVICE_DB_BUSY, SERVICE_ID_BYTES

QUEUED, GRADING, DONE = "queued", "grading", "done"

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    person TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,          -- sha256 of the token; the token is never stored
    issued REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    digest TEXT PRIMARY KEY,              -- sha256 of the browser's session id, never the id
    person TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL                 -- no use after this time
);
CREATE INDEX IF NOT EXISTS sessions_by_person ON sessions (person);
CREATE TABLE IF NOT EXISTS submissions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    student TEXT NOT NULL,
    assignment TEXT NOT NULL,
    notebook TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    path TEXT NOT NULL,                   -- the upload, on disk before the row exists
    created REAL NOT NULL,
    days_late INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'queued',
    claim_seq INTEGER,                    -- order in which graders took rows (fairness)
    started REAL,
    finished REAL,
    gradings INTEGER NOT NULL DEFAULT 0,  -- results committed for this row
    status TEXT, score REAL, max_score REAL, penalty REAL, message TEXT, seconds REAL,
    csv_row TEXT,                         -- report.csv_row of the result, as JSON
    results TEXT,                         -- its results.json
    executed TEXT,                        -- its executed notebook, if it ran
    key TEXT,                             -- its id in URLs: random, never guessable
    phases TEXT,                          -- seconds per grading phase, as JSON
    tests TEXT,                           -- its tests as the feedback shows them, as JSON
    speeds TEXT,                          -- its measured speed tests (board.measured_speeds)
    UNIQUE (student, assignment, notebook, attempt)
);
CREATE INDEX IF NOT EXISTS by_state ON submissions (state);
CREATE INDEX IF NOT EXISTS by_learner ON submissions (student, assignment, notebook);
CREATE UNIQUE INDEX IF NOT EXISTS by_key ON submissions (key);
CREATE TABLE IF NOT EXISTS board_names (
    person TEXT PRIMARY KEY,              -- who opted in to the speed leaderboard
    name TEXT NOT NULL,                   -- the display name the board shows for them
    folded TEXT NOT NULL UNIQUE,          -- board.folded(name): one person per name
    chosen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lti_people (
    issuer TEXT NOT NULL,                 -- who an LMS user is here: (issuer, deployment,
    deployment TEXT NOT NULL,             -- sub) -> person, written at their first launch
    sub TEXT NOT NULL,                    -- and never changed
    person TEXT NOT NULL UNIQUE,          -- the id of grades.csv, the gradebook, the uploads
    role TEXT NOT NULL,                   -- learner or instructor, as of their last launch
    name TEXT NOT NULL DEFAULT '',
    first_launch REAL NOT NULL,
    last_launch REAL NOT NULL,
    PRIMARY KEY (issuer, deployment, sub)
);
CREATE TABLE IF NOT EXISTS lti_logins (
    digest TEXT PRIMARY KEY,              -- sha256 of a login's state (the browser has it)
    nonce TEXT NOT NULL,
    issuer TEXT NOT NULL,
    client_id TEXT NOT NULL,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lti_nonces (
    nonce TEXT PRIMARY KEY,               -- an id_token's nonce, once used
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lti_links (
    person TEXT NOT NULL,                 -- where a learner's score of an assignment goes:
    assignment TEXT NOT NULL,             -- the line item of the link they last launched
    issuer TEXT NOT NULL,
    client_id TEXT NOT NULL,
    sub TEXT NOT NULL,                    -- the score's userId
    lineitem TEXT NOT NULL,
    PRIMARY KEY (person, assignment)
);
CREATE TABLE IF NOT EXISTS lti_rosters (
    memberships TEXT PRIMARY KEY,         -- a course's roster service (NRPS), as a launch
    issuer TEXT NOT NULL,                 -- offered it
    client_id TEXT NOT NULL,
    deployment TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lti_scores (
    id INTEGER PRIMARY KEY AUTOINCREMENT, -- the outbox: scores for the LMS, sent in order
    person TEXT NOT NULL,
    assignment TEXT NOT NULL,
    score REAL NOT NULL,
    max_score REAL NOT NULL,
    created REAL NOT NULL,                -- the score's timestamp
    state TEXT NOT NULL DEFAULT 'pending',  -- pending, sent, superseded, closed
    tries INTEGER NOT NULL DEFAULT 0,
    next_try REAL NOT NULL,
    last_error TEXT,
    sent REAL
);
CREATE INDEX IF NOT EXISTS lti_scores_due ON lti_scores (state, next_try);
CREATE TABLE IF NOT EXISTS extensions (
    person TEXT NOT NULL,                 -- a learner's own deadline and/or uploads an hour
    assignment TEXT NOT NULL,             -- for one assignment, granted on the instructor
    deadline REAL,                        -- page (NULL: the assignment's)
    attempts_per_hour INTEGER,            -- (NULL: the assignment's)
    granted_by TEXT NOT NULL,             -- the instructor who granted it
    granted REAL NOT NULL,
    PRIMARY KEY (person, assignment)
);
"""

# The schema's versions: 1, the first service (no version stored); 2, random ids in URLs
# (``key``; stored, as 0, only by that column); 3, ``phases``, the version stored;
# 4, ``sessions`` (a browser's sign-in, apart from the person's token); 5, ``tests``;
# 6, the speed leaderboard (``speeds``, ``board_names``); 7, LTI (``lti_*``).
# (A new table alone needs no version: every open creates the tables it lacks, and an
# earlier service ignores it; so ``extensions`` came without one.)
SCHEMA_VERSION = 7


def _add_keys(db: sqlite3.Connection) -> None:
    """Version 2: every submission gets a random id for its URLs (old rows too)."""
    db.execute("ALTER TABLE submissions ADD COLUMN key TEXT")
    for (row_id,) in db.execute("SELECT id FROM submissions").fetchall():
        db.execute("UPDATE submissions SET key = ? WHERE id = ?",
                   (secrets.token_urlsafe(SERVICE_ID_BYTES), row_id))


def _add_phases(db: sqlite3.Connection) -> None:
    """Version 3: each grading's seconds per phase (none known for earlier gradings)."""
    db.execute("ALTER TABLE submissions ADD COLUMN phases TEXT")


def _add_sessions(db: sqlite3.Connection) -> None:
    """Version 4: browsers' sessions (a cookie of version 3 held the token itself and
    signs no one in now: its holder signs in again with their link)."""
    for statement in statements(SCHEMA):
        if "sessions" in statement:
            db.execute(statement)


def _add_tests(db: sqlite3.Connection) -> None:
    """Version 5: each result's tests as the feedback shows them, kept in the row (the
    feedback was read from results.json at every view): taken from those files once."""
    db.execute("ALTER TABLE submissions ADD COLUMN tests TEXT")
    for row_id, results in db.execute("SELECT id, results FROM submissions WHERE results "
                                      "IS NOT NULL").fetchall():
        try:
            tests = shown_tests(json.loads(Path(results).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a file gone or unreadable: that upload shows no tests, as before
        db.execute("UPDATE submissions SET tests = ? WHERE id = ?", (json.dumps(tests), row_id))


def _add_board(db: sqlite3.Connection) -> None:
    """Version 6: the speed leaderboard. Each graded upload's measured speed tests, kept in
    its row (taken once from the results.json of uploads graded before), and the display
    names of those who opt in (none yet: no one is on the board until they say so)."""
    from autograder.service.board import measured_speeds
    db.execute("ALTER TABLE submissions ADD COLUMN speeds TEXT")
    for row_id, results in db.execute("SELECT id, results FROM submissions WHERE results "
                                      "IS NOT NULL").fetchall():
        try:
            speeds = measured_speeds(json.loads(Path(results).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a file gone or unreadable: that upload is on no board
        db.execute("UPDATE submissions SET speeds = ? WHERE id = ?", (json.dumps(speeds), row_id))
    for statement in statements(SCHEMA):
        if "board_names" in statement:
            db.execute(statement)


def _add_lti(db: sqlite3.Connection) -> None:
    """Version 7: LTI's people, logins, nonces, links and score outbox (all empty)."""
    for statement in statements(SCHEMA):
        if "lti_" in statement:
            db.execute(statement)


MIGRATIONS = {2: _add_keys, 3: _add_phases, 4: _add_sessions, 5: _add_tests,
              6: _add_board, 7: _add_lti}  # version -> the step that reaches it


def statements(script: str) -> List[str]:
    """The SQL statements of ``script``, one by one."""
    found, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    return found


class DatabaseError(ValueError):
    """The database cannot be used by this service (made by a later version of it)."""


def stored_version(db: sqlite3.Connection) -> int:
    """The schema version of an open database; 0 for one with no tables yet."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version:
        return version
    columns = {r[1] for r in db.execute("PRAGMA table_info(submissions)")}
    if not columns:
        return 0
    return 2 if "key" in columns else 1  # made before the version was stored


def when(stamp: Optional[float]) -> str:
    """A stored time as people read it."""
    if stamp is None:
        return ""
    from datetime import datetime, timezone
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def fair_order(queued: Sequence[Tuple[int, str]], last_served: Dict[str, int]) -> List[int]:
    """The order in which the ``queued`` rows, ``(id, student)`` with ids in upload order,
    will be graded: each time, the oldest row of the learner whose last row was taken
    longest ago (``last_served``: student -> claim sequence number; never served first)."""
    served = dict(last_served)
    sequence = max(served.values(), default=0)
    pending = sorted(queued)
    order = []
    while pending:
        best = min(pending, key=lambda row: (served.get(row[1], 0), row[0]))
        pending.remove(best)
        sequence += 1
        served[best[1]] = sequence
        order.append(best[0])
    return order


@dataclass
class Row:
    """One submission as stored."""
    id: int
    student: str
    assignment: str
    notebook: str
    attempt: int
    path: str
    created: float
    days_late: int
    state: str
    claim_seq: Optional[int]
    started: Optional[float]
    finished: Optional[float]
    gradings: int
    status: Optional[str]
    score: Optional[float]
    max_score: Optional[float]
    penalty: Optional[float]
    message: Optional[str]
    seconds: Optional[float]
    csv_row: Optional[str]
    results: Optional[str]
    executed: Optional[str]
    key: Optional[str]
    phases: Optional[str]     # JSON: {phase: seconds}, in the order they ran
    tests: Optional[str]      # JSON: feedback.shown_tests of its result
    speeds: Optional[str] = None  # JSON: board.measured_speeds of its result

    @property
    def phase_seconds(self) -> Dict[str, float]:
        return json.loads(self.phases) if self.phases else {}

    @property
    def shown_tests(self) -> List[dict]:
        return json.loads(self.tests) if self.tests else []

    @property
    def measured_speeds(self) -> List[dict]:
        return json.loads(self.speeds) if self.speeds else []

    @property
    def counted_score(self) -> Optional[float]:
        if self.score is None:
            return None
        return round(self.score - (self.penalty or 0.0), 6)


COLUMNS = ", ".join(Row.__dataclass_fields__)


class Store:
    """The database file; every method opens its own connection (any thread may call)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
        self._migrate()

    def _migrate(self) -> None:
        """Create the tables, or bring an earlier version's forward (all rows kept)."""
        with self._db() as db:
            version = self._usable_version(db)
            if 0 < version < SCHEMA_VERSION:  # the file as it was, kept beside it
                kept = self.path.with_name(f"{self.path.name}.schema{version}")
                if not kept.exists():
                    with contextlib.closing(sqlite3.connect(kept)) as copy:
                        db.backup(copy)  # (not in a transaction: it would wait for itself)
        with self._write() as db:
            version = self._usable_version(db)  # again: another may have migrated it
            for step in range(version + 1 if version else SCHEMA_VERSION + 1,
                              SCHEMA_VERSION + 1):  # (a new file has none to take)
                MIGRATIONS[step](db)
            for statement in statements(SCHEMA):  # not executescript: it would commit
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _usable_version(self, db: sqlite3.Connection) -> int:
        version = stored_version(db)
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.path} was made by a later version of the service (schema "
                f"{version}; this one knows {SCHEMA_VERSION} and earlier): run that "
                "version, or give this one another --db")
        return version

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=SERVICE_DB_BUSY, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed on leaving (rolled back on an error)."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # sign-in tokens

    def set_token(self, person: str, token: str) -> None:
        """``token`` is now ``person``'s, replacing the old one; their sessions end."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO tokens (person, digest, issued) VALUES (?, ?, ?)",
                       (person, digest(token), time.time()))
            db.execute("DELETE FROM sessions WHERE person = ?", (person,))

    def person_of(self, token: str) -> Optional[str]:
        with self._db() as db:
            found = db.execute("SELECT person FROM tokens WHERE digest = ?",
                               (digest(token),)).fetchone()
        return found[0] if found else None

    # browsers' sessions

    def start_session(self, person: str, lifetime: float) -> str:
        """A new session of ``person`` for ``lifetime`` seconds: its id, for the browser's
        cookie (only its SHA-256 is stored). Ended sessions' rows go."""
        session = secrets.token_urlsafe(32)
        now = time.time()
        with self._write() as db:
            db.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            db.execute("INSERT INTO sessions (digest, person, created, expires) "
                       "VALUES (?, ?, ?, ?)", (digest(session), person, now, now + lifetime))
        return session

    def session_person(self, session: str) -> Optional[str]:
        """Who the session ``session`` is of, while it lasts; None otherwise."""
        with self._db() as db:
            found = db.execute("SELECT person FROM sessions WHERE digest = ? AND expires > ?",
                               (digest(session), time.time())).fetchone()
        return found[0] if found else None

    def end_session(self, session: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM sessions WHERE digest = ?", (digest(session),))

    # submissions

    def _rows(self, db, where: str = "", args: tuple = ()) -> List[Row]:
        return [Row(*r) for r in db.execute(f"SELECT {COLUMNS} FROM submissions {where}", args)]

    def rows(self, where: str = "", args: tuple = ()) -> List[Row]:
        with self._db() as db:
            return self._rows(db, where, args)

    def get(self, submission_id: int) -> Optional[Row]:
        found = self.rows("WHERE id = ?", (submission_id,))
        return found[0] if found else None

    def by_key(self, key: str) -> Optional[Row]:
        """The submission whose URL id is ``key`` (the integer id stays internal)."""
        found = self.rows("WHERE key = ?", (key,))
        return found[0] if found else None

    def upload_times(self, student: str, assignment: str, since: float) -> List[float]:
        """When ``student`` uploaded for ``assignment`` since ``since``, oldest first."""
        with self._db() as db:
            return [r[0] for r in db.execute(
                "SELECT created FROM submissions WHERE student = ? AND assignment = ? AND "
                "created >= ? ORDER BY created", (student, assignment, since))]

    def next_attempt(self, student: str, assignment: str, notebook: str) -> int:
        with self._db() as db:
            return db.execute("SELECT COALESCE(MAX(attempt), 0) + 1 FROM submissions WHERE "
                              "student = ? AND assignment = ? AND notebook = ?",
                              (student, assignment, notebook)).fetchone()[0]

    def add(self, student: str, assignment: str, notebook: str, attempt: int, path: Path,
            created: float, days_late: int) -> int:
        """Queue an upload whose file is already on disk; committed when this returns."""
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO submissions (student, assignment, notebook, attempt, path, created, "
                "days_late, key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (student, assignment, notebook, attempt, str(path), created, days_late,
                 secrets.token_urlsafe(SERVICE_ID_BYTES)))
            return cursor.lastrowid

    def _queue(self, db) -> Tuple[List[int], int]:
        queued = db.execute("SELECT id, student FROM submissions WHERE state = ?",
                            (QUEUED,)).fetchall()
        served = dict(db.execute("SELECT student, MAX(claim_seq) FROM submissions WHERE "
                                 "claim_seq IS NOT NULL GROUP BY student").fetchall())
        return fair_order(queued, served), max(served.values(), default=0)

    def queue(self) -> List[int]:
        """The queued rows' ids, in the order they will be graded."""
        with self._db() as db:
            return self._queue(db)[0]

    def ids_of(self, student: str) -> List[Tuple[int]]:
        """The ids of one learner's uploads."""
        with self._db() as db:
            return db.execute("SELECT id FROM submissions WHERE student = ?",
                              (student,)).fetchall()

    def states(self) -> List[Tuple[str, float]]:
        """(state, created) of every upload not done: what the health check counts."""
        with self._db() as db:
            return db.execute("SELECT state, created FROM submissions WHERE state != ?",
                              (DONE,)).fetchall()

    def claim_next(self, per_learner: Optional[int] = None) -> Optional[Row]:
        """Take the next row in fair order for grading, or None when nothing is queued;
        with ``per_learner``, none of a learner who has that many being graded already."""
        with self._write() as db:
            order, sequence = self._queue(db)
            if per_learner is not None and order:
                busy = {student for student, count in db.execute(
                    "SELECT student, COUNT(*) FROM submissions WHERE state = ? GROUP BY "
                    "student", (GRADING,)) if count >= per_learner}
                owner = dict(db.execute("SELECT id, student FROM submissions WHERE state = ?",
                                        (QUEUED,)).fetchall())
                order = [i for i in order if owner[i] not in busy]
            if not order:
                return None
            db.execute("UPDATE submissions SET state = ?, claim_seq = ?, started = ? "
                       "WHERE id = ?", (GRADING, sequence + 1, time.time(), order[0]))
            return self._rows(db, "WHERE id = ?", (order[0],))[0]

    def requeue_interrupted(self) -> int:
        """Queue again what a stopped service was grading (at start, before any grader)."""
        with self._write() as db:
            return db.execute("UPDATE submissions SET state = ? WHERE state = ?",
                              (QUEUED, GRADING)).rowcount

    def put_back(self, submission_id: int) -> bool:
        """Queue a row being graded again (its grading could not be committed)."""
        with self._write() as db:
            return db.execute("UPDATE submissions SET state = ? WHERE id = ? AND state = ?",
                              (QUEUED, submission_id, GRADING)).rowcount == 1

    def requeue(self, ids: Sequence[int]) -> int:
        """Queue finished rows again (a regrade)."""
        with self._write() as db:
            return sum(db.execute("UPDATE submissions SET state = ? WHERE id = ? AND state = ?",
                                  (QUEUED, i, DONE)).rowcount for i in ids)

    def finish(self, submission_id: int, **fields) -> bool:
        """Commit a grading row's result; False if the row was not being graded."""
        names = sorted(fields)
        sets = ", ".join(f"{name} = ?" for name in names)
        with self._write() as db:
            return db.execute(
                f"UPDATE submissions SET {sets}, state = ?, finished = ?, "
                "gradings = gradings + 1 WHERE id = ? AND state = ?",
                (*(fields[n] for n in names), DONE, time.time(), submission_id, GRADING)
            ).rowcount == 1

    def counted(self, student: str, assignment: str, notebook: str,
                rule: str) -> Optional[Row]:
        """The attempt that counts: the last one graded, or the best (latest of equals).

        A row queued again (a regrade) keeps its last result until the new one is
        committed, and counts with it meanwhile."""
        done = self.rows("WHERE student = ? AND assignment = ? AND notebook = ? AND "
                         "gradings > 0 AND status IS NOT NULL", (student, assignment, notebook))
        if not done:
            return None
        if rule == "best":
            return max(done, key=lambda r: (r.counted_score or 0.0, r.attempt))
        return max(done, key=lambda r: r.attempt)

    # extensions granted on the instructor page

    def grant_extension(self, person: str, assignment: str, deadline: Optional[float],
                        attempts_per_hour: Optional[int], granted_by: str) -> None:
        """``person``'s extension of ``assignment`` is this one now (replacing theirs)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO extensions (person, assignment, deadline, "
                       "attempts_per_hour, granted_by, granted) VALUES (?, ?, ?, ?, ?, ?)",
                       (person, assignment, deadline, attempts_per_hour, granted_by,
                        time.time()))

    def withdraw_extension(self, person: str, assignment: str) -> bool:
        with self._write() as db:
            return db.execute("DELETE FROM extensions WHERE person = ? AND assignment = ?",
                              (person, assignment)).rowcount == 1

    def extensions(self, person: Optional[str] = None) -> List[tuple]:
        """(person, assignment, deadline, attempts_per_hour, granted_by, granted) of each
        extension granted (of ``person`` only, if given), by person and assignment."""
        where, args = ("WHERE person = ?", (person,)) if person is not None else ("", ())
        with self._db() as db:
            return db.execute("SELECT person, assignment, deadline, attempts_per_hour, "
                              f"granted_by, granted FROM extensions {where} ORDER BY person, "
                              "assignment", args).fetchall()

    # the speed leaderboard

    def board_names(self) -> Dict[str, str]:
        """Who is on the speed leaderboard: person -> their display name."""
        with self._db() as db:
            return dict(db.execute("SELECT person, name FROM board_names"))

    def join_board(self, person: str, name: str) -> None:
        """``person`` is on the leaderboard as ``name`` (checked with board.display_name),
        or under this new name; NameRefused if another person has that name."""
        from autograder.service.board import NameRefused, folded
        try:
            with self._write() as db:
                db.execute("INSERT INTO board_names (person, name, folded, chosen) VALUES "
                           "(?, ?, ?, ?) ON CONFLICT (person) DO UPDATE SET name = "
                           "excluded.name, folded = excluded.folded, chosen = excluded.chosen",
                           (person, name, folded(name), time.time()))
        except sqlite3.IntegrityError:
            raise NameRefused(f"the display name {name!r} is someone else's already: "
                              "choose another") from None

    def leave_board(self, person: str) -> bool:
        """``person`` is on the leaderboard no more (their rows go with their name)."""
        with self._write() as db:
            return db.execute("DELETE FROM board_names WHERE person = ?",
                              (person,)).rowcount == 1

    # LTI (service/lti.py): who an LMS user is, logins, and the scores' outbox

    def lti_person(self, issuer: str, deployment: str, sub: str, role: str, name: str,
                   new_id) -> str:
        """The person an LMS user is: the id given at their first launch (``new_id()``),
        the same ever after; their role and name as this launch says."""
        now = time.time()
        with self._write() as db:
            found = db.execute("SELECT person FROM lti_people WHERE issuer = ? AND "
                               "deployment = ? AND sub = ?", (issuer, deployment, sub)).fetchone()
            if found:
                db.execute("UPDATE lti_people SET role = ?, name = ?, last_launch = ? WHERE "
                           "person = ?", (role, name, now, found[0]))
                return found[0]
            person = new_id(issuer, deployment, sub)
            db.execute("INSERT INTO lti_people (issuer, deployment, sub, person, role, name, "
                       "first_launch, last_launch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (issuer, deployment, sub, person, role, name, now, now))
            return person

    def lti_role(self, person: str) -> Optional[str]:
        """The role of an LMS user here as of their last launch; None if not one."""
        with self._db() as db:
            found = db.execute("SELECT role FROM lti_people WHERE person = ?",
                               (person,)).fetchone()
        return found[0] if found else None

    def lti_people(self) -> Dict[str, Tuple[str, str]]:
        """Everyone who came from an LMS: person -> (role, name)."""
        with self._db() as db:
            return {person: (role, name) for person, role, name in
                    db.execute("SELECT person, role, name FROM lti_people")}

    def start_login(self, state: str, nonce: str, issuer: str, client_id: str,
                    lifetime: float) -> None:
        now = time.time()
        with self._write() as db:
            db.execute("DELETE FROM lti_logins WHERE expires <= ?", (now,))
            db.execute("INSERT INTO lti_logins (digest, nonce, issuer, client_id, expires) "
                       "VALUES (?, ?, ?, ?, ?)", (digest(state), nonce, issuer, client_id,
                                                  now + lifetime))

    def end_login(self, state: str) -> Optional[Tuple[str, str, str]]:
        """(nonce, issuer, client_id) of the login ``state`` began, once; None if there was
        none, it ended already or it expired."""
        with self._write() as db:
            found = db.execute("SELECT nonce, issuer, client_id FROM lti_logins WHERE digest = ? "
                               "AND expires > ?", (digest(state), time.time())).fetchone()
            db.execute("DELETE FROM lti_logins WHERE digest = ?", (digest(state),))
        return tuple(found) if found else None

    def use_nonce(self, nonce: str, expires: float) -> bool:
        """Record an id_token's nonce; False if it was used before (a replay)."""
        with self._write() as db:
            db.execute("DELETE FROM lti_nonces WHERE expires <= ?", (time.time(),))
            try:
                db.execute("INSERT INTO lti_nonces (nonce, expires) VALUES (?, ?)",
                           (nonce, expires))
            except sqlite3.IntegrityError:
                return False
        return True

    def set_lti_link(self, person: str, assignment: str, issuer: str, client_id: str, sub: str,
                     lineitem: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO lti_links (person, assignment, issuer, client_id, "
                       "sub, lineitem) VALUES (?, ?, ?, ?, ?, ?)",
                       (person, assignment, issuer, client_id, sub, lineitem))

    def set_lti_roster(self, memberships: str, issuer: str, client_id: str,
                       deployment: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO lti_rosters (memberships, issuer, client_id, "
                       "deployment) VALUES (?, ?, ?, ?)",
                       (memberships, issuer, client_id, deployment))

    def lti_link(self, person: str, assignment: str) -> Optional[Tuple[str, str, str, str]]:
        """(issuer, client_id, sub, lineitem) where ``person``'s score of ``assignment`` goes."""
        with self._db() as db:
            found = db.execute("SELECT issuer, client_id, sub, lineitem FROM lti_links WHERE "
                               "person = ? AND assignment = ?", (person, assignment)).fetchone()
        return tuple(found) if found else None

    def roster_services(self) -> List[Tuple[str, str, str, str]]:
        """(issuer, client_id, deployment, memberships URL) of each course roster an LMS
        offered at a launch."""
        with self._db() as db:
            return db.execute("SELECT issuer, client_id, deployment, memberships FROM "
                              "lti_rosters ORDER BY memberships").fetchall()

    def queue_score(self, person: str, assignment: str, score: float, max_score: float,
                    state: str = "pending") -> Optional[int]:
        """Put a score in the outbox unless it is the one put there last for this learner
        and assignment (one post per change); earlier unsent ones are superseded."""
        now = time.time()
        with self._write() as db:
            last = db.execute("SELECT score, max_score FROM lti_scores WHERE person = ? AND "
                              "assignment = ? ORDER BY id DESC LIMIT 1",
                              (person, assignment)).fetchone()
            if last is not None and tuple(last) == (score, max_score):
                return None
            db.execute("UPDATE lti_scores SET state = 'superseded' WHERE person = ? AND "
                       "assignment = ? AND state = 'pending'", (person, assignment))
            return db.execute("INSERT INTO lti_scores (person, assignment, score, max_score, "
                              "created, state, next_try) VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (person, assignment, score, max_score, now, state, now)).lastrowid

    def due_scores(self) -> List[tuple]:
        """(id, person, assignment, score, max_score, created, tries) of each score due."""
        with self._db() as db:
            return db.execute("SELECT id, person, assignment, score, max_score, created, tries "
                              "FROM lti_scores WHERE state = 'pending' AND next_try <= ? "
                              "ORDER BY id", (time.time(),)).fetchall()

    def next_score_due(self) -> Optional[float]:
        with self._db() as db:
            return db.execute("SELECT MIN(next_try) FROM lti_scores WHERE state = 'pending'"
                              ).fetchone()[0]

    def score_done(self, score_id: int, state: str) -> None:
        """A score sent (``sent``), or not to be sent (``closed``)."""
        with self._write() as db:
            db.execute("UPDATE lti_scores SET state = ?, sent = ? WHERE id = ? AND state = "
                       "'pending'", (state, time.time() if state == "sent" else None, score_id))

    def score_failed(self, score_id: int, error: str, wait: float) -> None:
        with self._write() as db:
            db.execute("UPDATE lti_scores SET tries = tries + 1, last_error = ?, next_try = ? "
                       "WHERE id = ?", (error[:500], time.time() + wait, score_id))

    def scores_outbox(self) -> List[tuple]:
        """Every score of the outbox: (person, assignment, score, max_score, state, tries,
        last_error), newest first (the instructor page)."""
        with self._db() as db:
            return db.execute("SELECT person, assignment, score, max_score, state, tries, "
                              "last_error FROM lti_scores ORDER BY id DESC").fetchall()

    def speed_uploads(self, assignment: str) -> List[Tuple[str, str, Optional[float], List[dict]]]:
        """(student, notebook, when graded, measured speeds) of each graded upload of
        ``assignment`` that measured a speed test (an upload queued again for a regrade
        keeps its last result meanwhile)."""
        with self._db() as db:
            found = db.execute("SELECT student, notebook, finished, speeds FROM submissions "
                               "WHERE assignment = ? AND gradings > 0 AND speeds IS NOT NULL "
                               "AND speeds != '[]'", (assignment,)).fetchall()
        return [(student, notebook, finished, json.loads(speeds))
                for student, notebook, finished, speeds in found]
