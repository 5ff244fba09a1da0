-- The service's database schema 2, as autograder/service_db.py made it from 0f33863 to
-- 4b5e5e8 (random keys; its version, 0, was not stored); the tests open such a file.
CREATE TABLE IF NOT EXISTS tokens (
    person TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,          -- sha256 of the token; the token is never stored
    issued REAL NOT NULL
);
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
    key TEXT UNIQUE,                      -- its id in URLs: random, never guessable
    UNIQUE (student, assignment, notebook, attempt)
);
CREATE INDEX IF NOT EXISTS by_state ON submissions (state);
CREATE INDEX IF NOT EXISTS by_learner ON submissions (student, assignment, notebook);
