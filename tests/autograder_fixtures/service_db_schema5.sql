-- The service's database schema 5, as autograder/service/db.py made it from 484aa66 to
-- 6fae465 (`tests`; its version stored in PRAGMA user_version); the tests open such a file.
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
    UNIQUE (student, assignment, notebook, attempt)
);
CREATE INDEX IF NOT EXISTS by_state ON submissions (state);
CREATE INDEX IF NOT EXISTS by_learner ON submissions (student, assignment, notebook);
CREATE UNIQUE INDEX IF NOT EXISTS by_key ON submissions (key);
PRAGMA user_version = 5;
