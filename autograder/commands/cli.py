"""Command line: ``python -m autograder grade``, ``check``, ``serve``, ``submit``, ``gradescope``,
``mutants`` and ``similarity``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from autograder.options import (SERVICE_HOST, SERVICE_PORT, SERVICE_SESSION_DAYS,
                      SERVICE_SUBMIT_WAIT, SIMILARITY_PAIRS, options_of)
from autograder.options import positive as _positive

KERNEL_OPTIONS = ("kernel", "memory", "disk", "processes")
TIME_LIMITS = ("timeout", "cell_timeout")


def add_options(command: argparse.ArgumentParser, name: str, *dests: str) -> None:
    """Add the declared options ``dests`` (autograder.options.OPTIONS) to ``command``,
    in that order (the order of its --help)."""
    declared = options_of(name)
    for dest in dests:
        option = declared[dest]
        command.add_argument(option.flag, **option.argument(name))


def parser(defaults: Optional[Dict[str, Dict[str, object]]] = None
           ) -> argparse.ArgumentParser:
    """The command line; ``defaults`` (by command, then dest) replace the built-in
    defaults (those of the course's nbgrader_config.py, see :func:`course_defaults`)."""
    top = argparse.ArgumentParser(
        prog="python -m autograder",
        description="Grade nbgrader submissions with papermill, or check your own notebook.")
    commands = top.add_subparsers(dest="command", required=True)

    grade = commands.add_parser(
        "grade", help="grade a folder of submissions (nbgrader's submitted/ layout)",
        description="Grade SUBMITTED/<student_id>/<assignment>/<notebook>.ipynb against the "
                    "instructor's notebooks; write OUT/grades.csv and per-submission results.")
    grade.add_argument("submitted", type=Path, metavar="SUBMITTED",
                       help="folder of submissions: SUBMITTED/<student_id>/<assignment>/*.ipynb")
    grade.add_argument("--assignment", required=True, metavar="NAME",
                       help="the assignment (a folder of the course's source directory)")
    grade.add_argument("--out", required=True, type=Path, metavar="OUT",
                       help="where grades.csv, the results and the executed notebooks go")
    add_options(grade, "grade", "jobs", "device", *TIME_LIMITS)
    grade.add_argument("--gradebook", nargs="?", const="sqlite:///gradebook.db", default=None,
                       metavar="DB_URL", help="also store the scores in nbgrader's gradebook "
                       "(default when given without a value: sqlite:///gradebook.db)")
    add_options(grade, "grade", "course", "profile", *KERNEL_OPTIONS)
    grade.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_options(grade, "grade", "scheduler", "retries")

    check = commands.add_parser(
        "check", help="run the visible tests of your notebook and show which pass",
        description="Run the visible tests of NOTEBOOK and print which pass, with the points.")
    check.add_argument("notebook", type=Path, metavar="NOTEBOOK", help="your notebook")
    check.add_argument("--source", type=Path, default=None, metavar="RELEASED",
                       help="the released notebook to take the tests from (default: NOTEBOOK)")
    add_options(check, "check", "device", "profile", *TIME_LIMITS, *KERNEL_OPTIONS)

    serve = commands.add_parser(
        "serve", help="a web service where learners hand in notebooks and get feedback",
        description="Serve the course in COURSE (default: here): learners sign in, upload a "
                    "notebook and get its feedback; instructors see every grade. People come "
                    "from COURSE/roster.toml, rules from COURSE/service.toml (see guide/service.md); with "
                    "--jupyterhub, from the JupyterHub that runs it as one of its services.")
    add_options(serve, "serve", "course")
    serve.add_argument("--host", default=SERVICE_HOST,
                       help="address to listen on (default %(default)s)")
    serve.add_argument("--port", type=_positive(int, zero=True), default=SERVICE_PORT,
                       help="port to listen on, 0 for any free one (default %(default)s)")
    serve.add_argument("--db", type=Path, default=None, metavar="PATH",
                       help="the service's database (default: COURSE/service.db; uploads and "
                            "results go in a folder beside it, <name>-files)")
    serve.add_argument("--gradebook", default="", metavar="DB_URL",
                       help="nbgrader's gradebook for the scores that count (default: "
                            "COURSE/gradebook.db, where nbgrader export reads)")
    serve.add_argument("--no-gradebook", dest="gradebook", action="store_const", const=None,
                       help="do not write scores to nbgrader's gradebook")
    serve.add_argument("--jupyterhub", action="store_true",
                       help="run as a service of the JupyterHub that started it: hub users are "
                            "learners, members of a hub group instructors, no roster; listens "
                            "on the service's url (see guide/jupyterhub.md)")
    serve.add_argument("--issue-tokens", nargs="*", default=None, metavar="ID",
                       help="print a new secret sign-in link for each person of the roster "
                            "(or the IDs given), replacing their old ones, and exit")
    serve.add_argument("--lti-roster", action="store_true",
                       help="print the course's members as the LMS lists them (LTI Names and "
                            "Role Provisioning Services; needs [lti] in service.toml and a "
                            "launch from the course first), with the id each has here, and exit")
    serve.add_argument("--behind-proxy", action="store_true",
                       help="a proxy that speaks HTTPS to browsers passes requests on: believe "
                            "its X-Forwarded-Proto and X-Real-IP / X-Forwarded-For headers "
                            "(sign-in cookies are then Secure; guide/service.md has an nginx example). "
                            "Listen on 127.0.0.1 only, where nothing else can send them")
    serve.add_argument("--session-days", type=_positive(float), default=SERVICE_SESSION_DAYS,
                       metavar="DAYS", help="how long a browser stays signed in after it signs "
                       "in with its link, unless it signs out (default %(default)g)")
    serve.add_argument("--url", default=None, metavar="URL",
                       help="the address people open, for --issue-tokens' links (default: "
                            "http://HOST:PORT)")
    add_options(serve, "serve", "jobs", "device", "scheduler", "retries", "profile",
                "max_connections", "header_timeout", "body_timeout", "max_cells",
                "learner_jobs", "learner_storage", *TIME_LIMITS, *KERNEL_OPTIONS)

    submit = commands.add_parser(
        "submit", help="hand in a notebook to the course's submission service",
        description="Upload NOTEBOOK to the submission service at URL, wait for its grade "
                    "and print the feedback.")
    submit.add_argument("notebook", type=Path, metavar="NOTEBOOK", help="your notebook")
    submit.add_argument("--to", required=True, metavar="URL",
                        help="the service's address, e.g. http://127.0.0.1:8765")
    submit.add_argument("--token", default=os.environ.get("JUPYTERHUB_API_TOKEN") or None,
                        metavar="TOKEN",
                        help="your secret sign-in token (the token=... of your link), or a "
                             "JupyterHub API token (default: $JUPYTERHUB_API_TOKEN, set in "
                             "your server on a hub)")
    submit.add_argument("--assignment", default="", metavar="NAME",
                        help="the assignment (default: the one with a notebook of that name)")
    submit.add_argument("--wait", type=_positive(float), default=SERVICE_SUBMIT_WAIT,
                        metavar="SECONDS", help="how long to wait for the grade "
                        "(default %(default)g)")
    gradescope = commands.add_parser(
        "gradescope", help="build the autograder zip of an assignment for Gradescope",
        description="Write the zip Gradescope's autograder takes for one assignment: setup.sh "
                    "(installs the grader and the course's pinned requirements), "
                    "run_autograder (grades each submission with `grade`), the course's "
                    "package and the instructor's notebook of that assignment only.")
    gradescope.add_argument("--assignment", required=True, metavar="NAME",
                            help="the assignment (a folder of the course's source directory)")
    gradescope.add_argument("--out", type=Path, default=None, metavar="FILE.zip",
                            help="where to write the zip (default: "
                                 "_build/gradescope/NAME.zip in the course directory)")
    add_options(gradescope, "gradescope", "course", *TIME_LIMITS)

    mutants = commands.add_parser(
        "mutants", help="find the rules of an assignment that no test checks (mutation analysis)",
        description="Change the instructor's answers one small way at a time (an operator, a "
                    "comparison, a constant, a dropped statement, a negated condition, swapped "
                    "arguments), grade each such mutant as a submission and list those that "
                    "keep full marks. Exit 1 if any survives that equivalent_mutants.toml "
                    "does not justify.")
    mutants.add_argument("assignment", metavar="ASSIGNMENT",
                         help="the assignment (a folder of the course's source directory)")
    add_options(mutants, "mutants", "course", "jobs", "device", "profile")
    mutants.add_argument("--seeds", type=_positive(int), default=3, metavar="N",
                         help="copies of each mutant handed in, each graded with its own "
                              "TEST_SEED; a mutant is killed only if every copy loses points "
                              "(default %(default)s)")
    add_options(mutants, "mutants", *TIME_LIMITS, *KERNEL_OPTIONS)

    similarity = commands.add_parser(
        "similarity", help="rank the pairs of learners whose answers are most alike, to look "
                           "at by hand",
        description="Compare the answer code of every pair of learners' hand-ins of "
                    "ASSIGNMENT, leaving out the code the course gave them, and print the "
                    "pairs ranked, most alike first. It only points; it changes no grade.")
    similarity.add_argument("assignment", metavar="ASSIGNMENT",
                            help="the assignment (a folder of the course's source directory)")
    add_options(similarity, "similarity", "course")
    handins = similarity.add_mutually_exclusive_group()
    handins.add_argument("--submitted", type=Path, default=None, metavar="DIR",
                         help="nbgrader's folder of submissions, DIR/<learner>/ASSIGNMENT/"
                              "*.ipynb (default: the course's submitted directory)")
    handins.add_argument("--db", type=Path, default=None, metavar="PATH",
                         help="instead, the submission service's database: each learner's "
                              "latest upload, as the service's page compares them")
    similarity.add_argument("--given", type=Path, action="append", default=[],
                            metavar="PATH", help="more code the course gave learners (a "
                            "Python file, a notebook or a folder of them), left out like the "
                            "released notebooks' code; may be repeated")
    similarity.add_argument("--top", type=_positive(int), default=SIMILARITY_PAIRS,
                            metavar="N", help="the pairs shown (default %(default)s)")
    similarity.add_argument("--json", type=Path, default=None, metavar="FILE",
                            help="also write the report, matching lines included, as JSON")
    similarity.add_argument("--html", type=Path, default=None, metavar="FILE",
                            help="also write the report as a web page (the service's page)")
    for name, values in (defaults or {}).items():
        commands.choices[name].set_defaults(**values)
    return top


def course_defaults(args: argparse.Namespace) -> Dict[str, object]:
    """The defaults the course's nbgrader_config.py sets (c.Autograder.*, c.Execute.timeout)
    for the command of ``args``, if it takes --course; ValueError for a wrong setting."""
    from autograder.options import COURSE_COMMANDS, config_defaults
    if args.command not in COURSE_COMMANDS:
        return {}
    config = course_of(args).config
    return config_defaults(args.command, config, str(Path(args.course) / "nbgrader_config.py"))


def grade_options(args: argparse.Namespace, hidden=()):
    """The one options object, from the command line's words (``auto`` left for the
    runner to resolve)."""
    from autograder.options import grade_options as made
    return made(vars(args), hidden=tuple(str(Path(p).resolve()) for p in hidden))


def _quiet_libraries() -> None:
    # papermill/nbclient log every cell timeout at ERROR; the results say it better.
    for name in ("papermill", "traitlets", "nbclient"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def course_of(args: argparse.Namespace):
    """The course ``--course`` names, read once per command (its nbgrader_config.py too)."""
    if getattr(args, "found_course", None) is None:
        from autograder.layout import Course
        args.found_course = Course.discover(args.course)
    return args.found_course


def _assignment_notebooks(args: argparse.Namespace) -> List[Path]:
    return sorted(course_of(args).assignment_path(args.assignment).glob("*.ipynb"))


def _open_spawner(args: argparse.Namespace, notebooks: List[Path]):
    """The run's spawner, opened before ``autograder.pipeline.grade`` and its libraries are
    imported: a fork server imports PyTorch meanwhile. The runner closes it. Its processes
    get the environment the grader writes, not this command's own (see :mod:`autograder.sandbox.policy`)."""
    from autograder.sandbox.imports import kernel_preload
    from autograder.sandbox.policy import process_environment
    from autograder.sandbox.spawn import open_spawner
    return open_spawner(args.kernel, kernel_preload(notebooks), process_environment())


def run_grade(args: argparse.Namespace) -> int:
    """Choose the runner once (this machine or a Dask cluster), then grade. The runner
    starts its spawners first: a fork server imports while we import and prepare."""
    notebooks = _assignment_notebooks(args)
    if args.scheduler:
        from autograder.runners.cluster import Cluster, ClusterError
        try:
            with Cluster(args.scheduler, retries=args.retries, kernel=args.kernel,
                         notebooks=notebooks) as cluster:
                return _grade(args, cluster)
        except ClusterError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    spawner = _open_spawner(args, notebooks)
    from autograder.runners.local import LocalRunner
    with LocalRunner(args.jobs, args.kernel, spawner=spawner) as runner:
        return _grade(args, runner)


def _grade(args: argparse.Namespace, runner) -> int:
    from autograder.layout import find_submissions
    from autograder.pipeline.report import status_counts, summary, write_grades_csv, write_submission

    from autograder.pipeline.rebuild import speed_tests_of
    from autograder.pipeline.speed import DeclarationError

    try:
        course = course_of(args)
        sources = course.source_notebooks(args.assignment)
        submissions = find_submissions(args.submitted, args.assignment, notebooks=list(sources),
                                       references={name: source.graded_view
                                                   for name, source in sources.items()})
        for source in sources.values():
            try:
                speed_tests_of(source.graded_view)
            except DeclarationError as error:
                raise DeclarationError(f"{source.path}: {error}") from None
    except (FileNotFoundError, DeclarationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # What needs no kernel comes first, while the fork servers do their imports.
    runner.prepare(sources)  # before anything is written
    # Kernels see none of these: the course, every submission, the results, the gradebook.
    hidden = [course.root, args.submitted, args.out]
    if args.gradebook and args.gradebook.startswith("sqlite:///"):
        hidden.append(Path(args.gradebook[len("sqlite:///"):]).resolve().parent)
    writer = None
    if args.gradebook:  # before resolve, which waits for the fork server: meanwhile
        from autograder.pipeline.gradebook import GradebookWriter
        writer = GradebookWriter(args.gradebook, course_id=course.course_id)
        writer.register_assignment(args.assignment, sources)
    options = runner.resolve(grade_options(args, hidden=hidden))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    jobs = runner.threads()
    print(f"Grading {len(submissions)} notebook(s) of {args.assignment!r} from {args.submitted} "
          f"on {options.device} (profile {options.profile}, {options.kernel} kernels, on "
          f"{runner.describe()}); "
          f"references from {course.assignment_path(args.assignment)}", flush=True)

    from tqdm import tqdm
    bar = tqdm(total=len(submissions), unit="nb", desc="Grading", file=sys.stderr,
               disable=args.no_progress or None, dynamic_ncols=True)
    done = []

    def on_result(result) -> None:
        write_submission(result, out)
        if writer is not None:
            writer.record(result)
        done.append(result)
        counts = status_counts(done)
        bar.set_postfix({k: v for k, v in counts.items() if v}, refresh=False)
        bar.update(1)

    start = time.perf_counter()
    try:
        results = runner.grade(submissions, sources, options, on_result=on_result)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    seconds = time.perf_counter() - start
    csv_path = write_grades_csv(results, out / "grades.csv")
    print(summary(results, seconds, jobs))
    print(f"Wrote {csv_path} and {len(results)} result file(s) under {out}"
          + (f"; scores stored in {writer.url}" if writer is not None else ""))
    return 0 if len(results) == len(submissions) else 1


def run_check(args: argparse.Namespace) -> int:
    notebook = Path(args.notebook)
    spawner = _open_spawner(args, [Path(args.source or notebook)])
    from autograder.commands.check import check, render
    from autograder.runners.local import LocalRunner
    try:
        with LocalRunner(1, args.kernel, spawner=spawner) as runner:
            report = check(notebook, source=args.source, options=grade_options(args),
                           runner=runner)
    except ValueError as error:
        print(f"error: {args.notebook}: {error}", file=sys.stderr)
        return 2
    print(render(report))
    return 0 if report.all_passed else 1


def run_serve(args: argparse.Namespace) -> int:
    """Read the course's roster and rules (a clear error if they are wrong), then issue
    tokens or serve, grading as ``grade`` does: on a :class:`~autograder.pipeline.grade.LocalRunner`,
    or with ``--scheduler`` on a Dask cluster (:class:`~autograder.runners.cluster.Cluster`)."""
    try:
        from autograder.service.app import ConfigError, Service
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("autograder.service"):
            raise
        print("error: the submission service is not part of the installed package: run "
              "`python -m autograder serve` from a checkout of the course (see "
              "guide/service.md)", file=sys.stderr)
        return 2
    if args.jupyterhub and args.issue_tokens is not None:
        print("error: --issue-tokens is for the standalone sign-in; on a JupyterHub the hub "
              "signs people in", file=sys.stderr)
        return 2
    from autograder.service.db import DatabaseError
    try:
        from autograder.options import service_limits
        limits = service_limits(vars(args))
        service = Service(args.course, db=args.db, gradebook=args.gradebook,
                          hub=args.jupyterhub, behind_proxy=args.behind_proxy,
                          session_days=args.session_days, limits=limits)
    except (ConfigError, DatabaseError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.issue_tokens is not None:
        unknown = sorted(set(args.issue_tokens) - set(service.config.people))
        if unknown:
            print(f"error: not in the roster: {', '.join(unknown)}", file=sys.stderr)
            return 2
        base = (args.url or f"http://{args.host}:{args.port}").rstrip("/")
        print("# Give each person their own line; a new one replaces the old. id, role, link:")
        for person, token in service.signin.issue(args.issue_tokens or None):
            print(f"{person.id}\t{person.role}\t{base}/signin?token={token}")
        return 0
    if args.lti_roster:
        return print_lti_roster(service)
    if args.scheduler:
        from autograder.runners.cluster import Cluster, ClusterError
        try:
            with Cluster(args.scheduler, retries=args.retries, kernel=args.kernel,
                         notebooks=service.notebooks()) as cluster:
                options = cluster.resolve(grade_options(args, hidden=service.hidden()))
                return service.run(cluster, options, args.host, args.port)
        except ClusterError as error:  # unreachable, no workers, workers that differ
            print(f"error: {error}", file=sys.stderr)
            return 2
    spawner = _open_spawner(args, service.notebooks())
    from autograder.runners.local import LocalRunner
    with LocalRunner(args.jobs, args.kernel, spawner=spawner) as runner:
        options = runner.resolve(grade_options(args, hidden=service.hidden()))
        return service.run(runner, options, args.host, args.port)


def print_lti_roster(service) -> int:
    """``serve --lti-roster``: the LMS's members, one a line (id here, LMS user id, role,
    status, name), from every course roster a launch has shown the service."""
    if service.lti is None:
        print("error: no [lti] table in service.toml: the service is not an LTI tool",
              file=sys.stderr)
        return 2
    try:
        members = service.lti.members()
    except OSError as error:
        print(f"error: the LMS's roster could not be read: {error}", file=sys.stderr)
        return 1
    if not members:
        print("# no roster yet: the LMS offers it at a launch; open an assignment from "
              "the LMS once", file=sys.stderr)
    print("# id here, LMS user id, role, status, name")
    for member in members:
        print("\t".join((member["person"], member["user_id"], member["role"],
                         member["status"], member["name"])))
    return 0


def run_submit(args: argparse.Namespace) -> int:
    from autograder.commands.submit import SubmitError, all_passed, render, upload, wait
    if not args.notebook.is_file():
        print(f"error: {args.notebook} is not a file", file=sys.stderr)
        return 2
    if not args.token:
        print("error: no token: give --token (the token=... of your sign-in link, or a "
              "JupyterHub token), or run it in your JupyterHub server", file=sys.stderr)
        return 2
    try:
        queued = upload(args.notebook, args.to, args.token, args.assignment)
        print(f"Handed in {args.notebook} for {queued['assignment']!r} (attempt "
              f"{queued['attempt']}); waiting for the grade...", flush=True)

        def progress(data):
            if data["state"] == "queued":
                print(f"  number {data['position']} in the queue", flush=True)
            else:
                print("  being graded", flush=True)
        data = wait(args.to, args.token, queued["id"], args.wait, on_wait=progress)
    except SubmitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(render(data))
    print(f"Feedback and the executed notebook: {args.to.rstrip('/')}/submissions/{data['id']}")
    return 0 if all_passed(data) else 1


def run_gradescope(args: argparse.Namespace) -> int:
    from autograder.commands.gradescope import build, describe
    from autograder.pipeline.grade import planned_tests
    from autograder.options import CPU, Limits, fields_of
    try:
        course = course_of(args)
        out = args.out or course.root / "_build" / "gradescope" / f"{args.assignment}.zip"
        built = build(course, args.assignment, out,
                      Limits(**fields_of("limits", vars(args))))
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    points = sum(test.points for source in course.source_notebooks(args.assignment).values()
                 for test in planned_tests(source, CPU).tests if not test.skipped)
    print(describe(built, points))
    return 0


def _skip_unneeded_grammar() -> None:
    # jsonschema, which nbformat imports, compiles a grammar for its "iri" format check when
    # the optional rfc3987_syntax package is installed: about 2 s of CPU at every start, for
    # a check the notebook schema never asks for. Marked absent in this process only (never
    # in a kernel), jsonschema simply goes without that check.
    sys.modules.setdefault("rfc3987_syntax", None)


def run_mutants(args: argparse.Namespace) -> int:
    from autograder.runners.local import LocalRunner
    from autograder.commands.mutants import format_report, run_mutants as mutate
    notebooks = _assignment_notebooks(args)
    if not notebooks:
        print(f"error: no assignment {args.assignment!r} with notebooks in the course",
              file=sys.stderr)
        return 2
    with LocalRunner(args.jobs, args.kernel, spawner=_open_spawner(args, notebooks)) as runner:
        try:
            report = mutate(args.course, args.assignment, runner, grade_options(args),
                            seeds=args.seeds)
        except (FileNotFoundError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    print(format_report(report))
    return 0 if report.ok else 1


def arguments(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line's words: a flag typed > the course's nbgrader_config.py > the
    built-in default. ValueError for a wrong setting in nbgrader_config.py."""
    args = parser().parse_args(argv)
    defaults = course_defaults(args)
    if defaults:  # parsed again with the course's defaults: a flag typed still wins
        found = args.found_course
        args = parser({args.command: defaults}).parse_args(argv)
        args.found_course = found
    return args


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = arguments(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _skip_unneeded_grammar()
    _quiet_libraries()
    if args.command == "grade":
        return run_grade(args)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "submit":
        return run_submit(args)
    if args.command == "gradescope":
        return run_gradescope(args)
    if args.command == "mutants":
        return run_mutants(args)
    if args.command == "similarity":
        from autograder.commands.similarity import run_similarity
        return run_similarity(args, course_of(args))
    return run_check(args)
