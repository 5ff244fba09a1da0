"""The command line's options, declared once (autograder.options), stay what users type.

PARSER is what the parser had before the options were declared in one place: every
subcommand's option strings, dest, default, choices, metavar, nargs, const and required
(``--jobs``'s default, the machine's cores, is written CORES)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autograder.commands import cli
from autograder.options import available_cores

PARSER = {'check': [((), 'notebook', None, None, 'NOTEBOOK', None, None, True),
           (('--cell-timeout',), 'cell_timeout', 300.0, None, 'SECONDS', None, None, False),
           (('--device',), 'device', 'auto', ('auto', 'cpu', 'cuda'), None, None, None, False),
           (('--disk',), 'disk', 1.0, None, 'GIB', None, None, False),
           (('--kernel',), 'kernel', 'fork', ('fork', 'fresh'), None, None, None, False),
           (('--memory',), 'memory', 4.0, None, 'GIB', None, None, False),
           (('--processes',), 'processes', 512, None, 'N', None, None, False),
           (('--profile',), 'profile', 'quick', ('quick', 'full'), None, None, None, False),
           (('--source',), 'source', None, None, 'RELEASED', None, None, False),
           (('--timeout',), 'timeout', 900.0, None, 'SECONDS', None, None, False)],
 'grade': [((), 'submitted', None, None, 'SUBMITTED', None, None, True),
           (('--assignment',), 'assignment', None, None, 'NAME', None, None, True),
           (('--cell-timeout',), 'cell_timeout', 300.0, None, 'SECONDS', None, None, False),
           (('--course',), 'course', '.', None, 'DIR', None, None, False),
           (('--device',), 'device', 'auto', ('auto', 'cpu', 'cuda'), None, None, None, False),
           (('--disk',), 'disk', 1.0, None, 'GIB', None, None, False),
           (('--gradebook',),
            'gradebook',
            None,
            None,
            'DB_URL',
            '?',
            'sqlite:///gradebook.db',
            False),
           (('--jobs',), 'jobs', 'CORES', None, 'N', None, None, False),
           (('--kernel',), 'kernel', 'fork', ('fork', 'fresh'), None, None, None, False),
           (('--memory',), 'memory', 4.0, None, 'GIB', None, None, False),
           (('--no-progress',), 'no_progress', False, None, None, 0, True, False),
           (('--out',), 'out', None, None, 'OUT', None, None, True),
           (('--processes',), 'processes', 512, None, 'N', None, None, False),
           (('--profile',), 'profile', 'auto', ('auto', 'quick', 'full'), None, None, None, False),
           (('--retries',), 'retries', 1, None, 'N', None, None, False),
           (('--scheduler',), 'scheduler', None, None, 'ADDRESS', None, None, False),
           (('--timeout',), 'timeout', 900.0, None, 'SECONDS', None, None, False)],
 'gradescope': [(('--assignment',), 'assignment', None, None, 'NAME', None, None, True),
                (('--cell-timeout',), 'cell_timeout', 300.0, None, 'SECONDS', None, None, False),
                (('--course',), 'course', '.', None, 'DIR', None, None, False),
                (('--out',), 'out', None, None, 'FILE.zip', None, None, False),
                (('--timeout',), 'timeout', 900.0, None, 'SECONDS', None, None, False)],
 'mutants': [((), 'assignment', None, None, 'ASSIGNMENT', None, None, True),
             (('--cell-timeout',), 'cell_timeout', 300.0, None, 'SECONDS', None, None, False),
             (('--course',), 'course', '.', None, 'DIR', None, None, False),
             (('--device',), 'device', 'auto', ('auto', 'cpu', 'cuda'), None, None, None, False),
             (('--disk',), 'disk', 1.0, None, 'GIB', None, None, False),
             (('--jobs',), 'jobs', 'CORES', None, 'N', None, None, False),
             (('--kernel',), 'kernel', 'fork', ('fork', 'fresh'), None, None, None, False),
             (('--memory',), 'memory', 4.0, None, 'GIB', None, None, False),
             (('--processes',), 'processes', 512, None, 'N', None, None, False),
             (('--profile',),
              'profile',
              'auto',
              ('auto', 'quick', 'full'),
              None,
              None,
              None,
              False),
             (('--seeds',), 'seeds', 3, None, 'N', None, None, False),
             (('--timeout',), 'timeout', 900.0, None, 'SECONDS', None, None, False)],
 'serve': [(('--behind-proxy',), 'behind_proxy', False, None, None, 0, True, False),
           (('--body-timeout',), 'body_timeout', 120.0, None, 'SECONDS', None, None, False),
           (('--cell-timeout',), 'cell_timeout', 300.0, None, 'SECONDS', None, None, False),
           (('--course',), 'course', '.', None, 'DIR', None, None, False),
           (('--db',), 'db', None, None, 'PATH', None, None, False),
           (('--device',), 'device', 'auto', ('auto', 'cpu', 'cuda'), None, None, None, False),
           (('--disk',), 'disk', 1.0, None, 'GIB', None, None, False),
           (('--gradebook',), 'gradebook', '', None, 'DB_URL', None, None, False),
           (('--header-timeout',), 'header_timeout', 10.0, None, 'SECONDS', None, None, False),
           (('--host',), 'host', '127.0.0.1', None, None, None, None, False),
           (('--issue-tokens',), 'issue_tokens', None, None, 'ID', '*', None, False),
           (('--jobs',), 'jobs', 'CORES', None, 'N', None, None, False),
           (('--jupyterhub',), 'jupyterhub', False, None, None, 0, True, False),
           (('--kernel',), 'kernel', 'fork', ('fork', 'fresh'), None, None, None, False),
           (('--learner-jobs',), 'learner_jobs', 2, None, 'N', None, None, False),
           (('--learner-storage',), 'learner_storage', 500.0, None, 'MIB', None, None, False),
           (('--lti-roster',), 'lti_roster', False, None, None, 0, True, False),
           (('--max-cells',), 'max_cells', 2000, None, 'N', None, None, False),
           (('--max-connections',), 'max_connections', 1000, None, 'N', None, None, False),
           (('--memory',), 'memory', 4.0, None, 'GIB', None, None, False),
           (('--no-gradebook',), 'gradebook', None, None, None, 0, None, False),
           (('--port',), 'port', 8765, None, None, None, None, False),
           (('--processes',), 'processes', 512, None, 'N', None, None, False),
           (('--profile',), 'profile', 'auto', ('auto', 'quick', 'full'), None, None, None, False),
           (('--retries',), 'retries', 1, None, 'N', None, None, False),
           (('--scheduler',), 'scheduler', None, None, 'ADDRESS', None, None, False),
           (('--session-days',), 'session_days', 14.0, None, 'DAYS', None, None, False),
           (('--timeout',), 'timeout', 900.0, None, 'SECONDS', None, None, False),
           (('--url',), 'url', None, None, 'URL', None, None, False)],
 'similarity': [((), 'assignment', None, None, 'ASSIGNMENT', None, None, True),
                (('--course',), 'course', '.', None, 'DIR', None, None, False),
                (('--db',), 'db', None, None, 'PATH', None, None, False),
                (('--given',), 'given', [], None, 'PATH', None, None, False),
                (('--html',), 'html', None, None, 'FILE', None, None, False),
                (('--json',), 'json', None, None, 'FILE', None, None, False),
                (('--submitted',), 'submitted', None, None, 'DIR', None, None, False),
                (('--top',), 'top', 30, None, 'N', None, None, False)],
 'submit': [((), 'notebook', None, None, 'NOTEBOOK', None, None, True),
            (('--assignment',), 'assignment', '', None, 'NAME', None, None, False),
            (('--to',), 'to', None, None, 'URL', None, None, True),
            (('--token',), 'token', None, None, 'TOKEN', None, None, False),
            (('--wait',), 'wait', 1800.0, None, 'SECONDS', None, None, False)]}


def _snapshot(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    top = cli.parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, command in commands.choices.items():
        rows = []
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            default = action.default
            if action.dest == "jobs":
                assert default == available_cores()
                default = "CORES"
            const = action.const
            rows.append((tuple(action.option_strings), action.dest,
                         str(default) if isinstance(default, Path) else default,
                         tuple(action.choices) if action.choices else None, action.metavar,
                         action.nargs, str(const) if isinstance(const, Path) else const,
                         action.required))
        out[name] = sorted(rows)
    return out


def test_every_subcommand_keeps_its_options(monkeypatch):
    got = _snapshot(monkeypatch)
    assert sorted(got) == sorted(PARSER)
    for name in PARSER:
        assert got[name] == PARSER[name], name


@pytest.mark.parametrize("words,ok", [
    (["grade", "S", "--assignment", "a", "--out", "o", "--jobs", "0"], False),
    (["grade", "S", "--assignment", "a", "--out", "o", "--retries", "0"], True),
    (["grade", "S", "--assignment", "a", "--out", "o", "--timeout", "-1"], False),
    (["grade", "S", "--assignment", "a", "--out", "o", "--memory", "0.5"], True),
    (["check", "nb.ipynb", "--profile", "auto"], False),
    (["serve", "--port", "0", "--learner-storage", "1.5"], True),
    (["serve", "--max-cells", "0"], False),
    (["mutants", "a", "--processes", "2.5"], False),
])
def test_accepted_values(words, ok, capsys):
    if ok:
        cli.parser().parse_args(words)
    else:
        with pytest.raises(SystemExit):
            cli.parser().parse_args(words)


@pytest.mark.parametrize("words", [["grade", "S", "--assignment", "a", "--out", "o"],
                                   ["serve"], ["mutants", "a"]])
def test_the_declared_defaults_are_the_classes_defaults(words):
    from autograder.options import GradeOptions, ServiceLimits, service_limits
    args = cli.parser().parse_args(words)
    assert cli.grade_options(args) == GradeOptions()
    if words[0] == "serve":
        assert service_limits(vars(args)) == ServiceLimits()


def test_check_keeps_its_quick_profile():
    from autograder.options import CHECK_PROFILE
    args = cli.parser().parse_args(["check", "nb.ipynb", "--memory", "0.5"])
    options = cli.grade_options(args)
    assert (options.profile, options.memory) == (CHECK_PROFILE, 512 * 1024 ** 2)
