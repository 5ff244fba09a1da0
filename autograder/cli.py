"""Command line: ``python -m autograder grade``, ``check``, ``serve``, ``submit``, ``gradescope``
and ``mutants``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from .options import (CHECK_PROFILE, DEVICE_CHOICES, KERNELS, PROFILE_CHOICES, PROFILES, RETRIES,
                      SERVICE_HOST, SERVICE_PORT, SERVICE_SESSION_DAYS, SERVICE_SUBMIT_WAIT, GiB,
                      MiB, ServiceLimits,
                      available_cores, default)


def _positive(kind, zero: bool = False):
    def parse(text: str):
        value = kind(text)
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"must be {'zero or more' if zero else 'positive'}, got {text}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
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
    grade.add_argument("--jobs", type=_positive(int), default=available_cores(), metavar="N",
                       help="submissions graded at once, each in its own kernel "
                            "(default: the number of cores, %(default)s here)")
    grade.add_argument("--device", choices=DEVICE_CHOICES, default=default("device"),
                       help="auto uses CUDA when PyTorch sees a GPU; GPU-only tests (grade_id "
                            "ending in _gpu) are skipped on the CPU")
    add_time_limits(grade)
    grade.add_argument("--gradebook", nargs="?", const="sqlite:///gradebook.db", default=None,
                       metavar="DB_URL", help="also store the scores in nbgrader's gradebook "
                       "(default when given without a value: sqlite:///gradebook.db)")
    grade.add_argument("--course", type=Path, default=Path("."), metavar="DIR",
                       help="the nbgrader course directory with the instructor's notebooks "
                            "(default: the current directory)")
    grade.add_argument("--profile", choices=PROFILE_CHOICES, default=default("profile"),
                       help="run profile for the notebooks (auto: full on CUDA, else quick)")
    add_kernel_options(grade)
    grade.add_argument("--no-progress", action="store_true", help="no progress bar")
    grade.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="grade on the workers of the Dask scheduler at ADDRESS (e.g. "
                            "tcp://10.0.0.5:8786), one task per submission; the workers' threads "
                            "set how many run at once (--jobs is not used), workers started "
                            "with --resources GPU=1 take --device cuda work, and auto picks "
                            "cuda when some worker has a GPU. The course and the submissions "
                            "must be at the same paths on every machine (see README)")
    grade.add_argument("--retries", type=_positive(int, zero=True), default=RETRIES, metavar="N",
                       help="with --scheduler: run a task that raised again on up to N more "
                            "tries (default %(default)s; tasks of workers that died are always "
                            "retried, up to the scheduler's allowed-failures)")

    check = commands.add_parser(
        "check", help="run the visible tests of your notebook and show which pass",
        description="Run the visible tests of NOTEBOOK and print which pass, with the points.")
    check.add_argument("notebook", type=Path, metavar="NOTEBOOK", help="your notebook")
    check.add_argument("--source", type=Path, default=None, metavar="RELEASED",
                       help="the released notebook to take the tests from (default: NOTEBOOK)")
    check.add_argument("--device", choices=DEVICE_CHOICES, default=default("device"),
                       help="auto uses CUDA when PyTorch sees a GPU (GPU-only tests need it)")
    check.add_argument("--profile", choices=PROFILES, default=CHECK_PROFILE,
                       help="run profile for the notebook (default %(default)s)")
    add_time_limits(check)
    add_kernel_options(check)

    serve = commands.add_parser(
        "serve", help="a web service where learners hand in notebooks and get feedback",
        description="Serve the course in COURSE (default: here): learners sign in, upload a "
                    "notebook and get its feedback; instructors see every grade. People come "
                    "from COURSE/roster.toml, rules from COURSE/service.toml (see README); with "
                    "--jupyterhub, from the JupyterHub that runs it as one of its services.")
    serve.add_argument("--course", type=Path, default=Path("."), metavar="DIR",
                       help="the nbgrader course directory (default: the current directory)")
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
                            "on the service's url (README: Running the submission service)")
    serve.add_argument("--issue-tokens", nargs="*", default=None, metavar="ID",
                       help="print a new secret sign-in link for each person of the roster "
                            "(or the IDs given), replacing their old ones, and exit")
    serve.add_argument("--behind-proxy", action="store_true",
                       help="a proxy that speaks HTTPS to browsers passes requests on: believe "
                            "its X-Forwarded-Proto and X-Real-IP / X-Forwarded-For headers "
                            "(sign-in cookies are then Secure; README has an nginx example). "
                            "Listen on 127.0.0.1 only, where nothing else can send them")
    serve.add_argument("--session-days", type=_positive(float), default=SERVICE_SESSION_DAYS,
                       metavar="DAYS", help="how long a browser stays signed in after it signs "
                       "in with its link, unless it signs out (default %(default)g)")
    serve.add_argument("--url", default=None, metavar="URL",
                       help="the address people open, for --issue-tokens' links (default: "
                            "http://HOST:PORT)")
    serve.add_argument("--jobs", type=_positive(int), default=available_cores(), metavar="N",
                       help="submissions graded at once (default: the number of cores, "
                            "%(default)s here)")
    serve.add_argument("--device", choices=DEVICE_CHOICES, default=default("device"),
                       help="as for grade")
    serve.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="grade on the workers of the Dask scheduler at ADDRESS, as grade "
                            "--scheduler does (--jobs is not used: as many uploads at once as "
                            "the workers had threads when the service started). The course "
                            "and the service's files must be at the same paths on every "
                            "machine (see README)")
    serve.add_argument("--retries", type=_positive(int, zero=True), default=RETRIES,
                       metavar="N", help="with --scheduler: as for grade (default %(default)s)")
    serve.add_argument("--profile", choices=PROFILE_CHOICES, default=default("profile"),
                       help="as for grade")
    limits = ServiceLimits()
    serve.add_argument("--max-connections", type=_positive(int), metavar="N",
                       default=limits.max_connections,
                       help="connections at once (default %(default)s, and no more than the "
                            "open-files limit allows); past it, the oldest one still sending "
                            "its headers is closed")
    serve.add_argument("--header-timeout", type=_positive(float), metavar="SECONDS",
                       default=limits.header_timeout,
                       help="close a connection that has not sent a request's headers by then "
                            "(or stays idle that long between requests; default %(default)g)")
    serve.add_argument("--body-timeout", type=_positive(float), metavar="SECONDS",
                       default=limits.body_timeout,
                       help="drop an upload not received by then (default %(default)g)")
    serve.add_argument("--max-cells", type=_positive(int), metavar="N",
                       default=limits.max_cells,
                       help="refuse a notebook of more cells (default %(default)s)")
    serve.add_argument("--learner-jobs", type=_positive(int), metavar="N",
                       default=limits.learner_jobs,
                       help="uploads of one learner graded at once (default %(default)s)")
    serve.add_argument("--learner-storage", type=_positive(float), metavar="MIB",
                       default=limits.learner_bytes / MiB,
                       help="MiB of files each learner's uploads may keep: the uploads and "
                            "their executed copies (default %(default)g)")
    add_time_limits(serve)
    add_kernel_options(serve)

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
    gradescope.add_argument("--course", type=Path, default=Path("."), metavar="DIR",
                            help="the course directory (default: the current directory)")
    add_time_limits(gradescope)

    mutants = commands.add_parser(
        "mutants", help="find the rules of an assignment that no test checks (mutation analysis)",
        description="Change the instructor's answers one small way at a time (an operator, a "
                    "comparison, a constant, a dropped statement, a negated condition, swapped "
                    "arguments), grade each such mutant as a submission and list those that "
                    "keep full marks. Exit 1 if any survives that equivalent_mutants.toml "
                    "does not justify.")
    mutants.add_argument("assignment", metavar="ASSIGNMENT",
                         help="the assignment (a folder of the course's source directory)")
    mutants.add_argument("--course", type=Path, default=Path("."), metavar="DIR",
                         help="the course directory (default: the current directory)")
    mutants.add_argument("--jobs", type=_positive(int), default=available_cores(), metavar="N",
                         help="mutants graded at once (default: one per core, %(default)s here)")
    mutants.add_argument("--device", choices=DEVICE_CHOICES, default=default("device"),
                         help="where the mutants run (default %(default)s)")
    mutants.add_argument("--profile", choices=PROFILE_CHOICES, default=default("profile"),
                         help="the notebooks' profile (default %(default)s)")
    mutants.add_argument("--seeds", type=_positive(int), default=3, metavar="N",
                         help="copies of each mutant handed in, each graded with its own "
                              "TEST_SEED; a mutant is killed only if every copy loses points "
                              "(default %(default)s)")
    add_time_limits(mutants)
    add_kernel_options(mutants)
    return top


def add_time_limits(command: argparse.ArgumentParser) -> None:
    command.add_argument("--timeout", type=_positive(float), default=default("notebook"),
                         metavar="SECONDS", help="time limit per notebook (default %(default)g)")
    command.add_argument("--cell-timeout", type=_positive(float), default=default("cell"),
                         metavar="SECONDS", help="time limit per cell (default %(default)g)")


def add_kernel_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--kernel", choices=KERNELS, default=default("kernel"),
                         help="fork kernels from a process with the imports done (default) or "
                              "start each as a new interpreter")
    command.add_argument("--memory", type=_positive(float), default=default("memory") / GiB,
                         metavar="GIB", help="data memory per kernel in GiB (default "
                         f"%(default)g); a kernel that holds more than this plus "
                         f"{default('memory_margin') / GiB:g} GiB is stopped")
    command.add_argument("--disk", type=_positive(float), default=default("disk") / GiB,
                         metavar="GIB", help="all the files a kernel writes in its working "
                         "directory, in GiB (default %(default)g)")
    command.add_argument("--processes", type=_positive(int), default=default("processes"),
                         metavar="N", help="processes and threads per kernel, all it starts "
                         "included (default %(default)s)")


def grade_options(args: argparse.Namespace, hidden=()):
    """The one options object, from the command line's words (``auto`` left for the
    runner to resolve)."""
    from .options import GradeOptions, Limits
    return GradeOptions(device=args.device, profile=args.profile, kernel=args.kernel,
                        limits=Limits(cell=args.cell_timeout, notebook=args.timeout),
                        memory=int(args.memory * GiB), disk=int(args.disk * GiB),
                        processes=args.processes,
                        hidden=tuple(str(Path(p).resolve()) for p in hidden))


def _quiet_libraries() -> None:
    # papermill/nbclient log every cell timeout at ERROR; the results say it better.
    for name in ("papermill", "traitlets", "nbclient"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _assignment_notebooks(args: argparse.Namespace) -> List[Path]:
    from .layout import Course
    return sorted(Course.discover(args.course).assignment_path(args.assignment).glob("*.ipynb"))


def _open_spawner(args: argparse.Namespace, notebooks: List[Path]):
    """The run's spawner, opened before ``autograder.grade`` and its libraries are
    imported: a fork server imports PyTorch meanwhile. The runner closes it. Its processes
    get the environment the grader writes, not this command's own (see :mod:`.policy`)."""
    from .imports import kernel_preload
    from .policy import process_environment
    from .spawn import open_spawner
    return open_spawner(args.kernel, kernel_preload(notebooks), process_environment())


def run_grade(args: argparse.Namespace) -> int:
    """Choose the runner once (this machine or a Dask cluster), then grade. The runner
    starts its spawners first: a fork server imports while we import and prepare."""
    notebooks = _assignment_notebooks(args)
    if args.scheduler:
        from .cluster import Cluster, ClusterError
        try:
            with Cluster(args.scheduler, retries=args.retries, kernel=args.kernel,
                         notebooks=notebooks) as cluster:
                return _grade(args, cluster)
        except ClusterError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    spawner = _open_spawner(args, notebooks)
    from .grade import LocalRunner
    with LocalRunner(args.jobs, args.kernel, spawner=spawner) as runner:
        return _grade(args, runner)


def _grade(args: argparse.Namespace, runner) -> int:
    from .layout import Course, find_submissions
    from .report import status_counts, summary, write_grades_csv, write_submission

    try:
        course = Course.discover(args.course)
        sources = course.source_notebooks(args.assignment)
        submissions = find_submissions(args.submitted, args.assignment, notebooks=list(sources),
                                       references={name: source.graded_view
                                                   for name, source in sources.items()})
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # What needs no kernel comes first, while the fork servers do their imports.
    runner.prepare(sources)  # before anything is written
    # Kernels see none of these: the course, every submission, the results, the gradebook.
    hidden = [course.root, args.submitted, args.out]
    if args.gradebook and args.gradebook.startswith("sqlite:///"):
        hidden.append(Path(args.gradebook[len("sqlite:///"):]).resolve().parent)
    options = runner.resolve(grade_options(args, hidden=hidden))
    writer = None
    if args.gradebook:
        from .gradebook import GradebookWriter
        writer = GradebookWriter(args.gradebook, course_id=course.course_id)
        writer.register_assignment(args.assignment, sources)
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
    from .check import check, render
    from .grade import LocalRunner
    try:
        with LocalRunner(1, args.kernel, spawner=spawner) as runner:
            options = runner.resolve(grade_options(args))
            report = check(notebook, source=args.source, options=options,
                           spawner=runner.spawner)
    except ValueError as error:
        print(f"error: {args.notebook}: {error}", file=sys.stderr)
        return 2
    print(render(report))
    return 0 if report.all_passed else 1


def run_serve(args: argparse.Namespace) -> int:
    """Read the course's roster and rules (a clear error if they are wrong), then issue
    tokens or serve, grading as ``grade`` does: on a :class:`~autograder.grade.LocalRunner`,
    or with ``--scheduler`` on a Dask cluster (:class:`~autograder.cluster.Cluster`)."""
    from .service.app import ConfigError, Service
    if args.jupyterhub and args.issue_tokens is not None:
        print("error: --issue-tokens is for the standalone sign-in; on a JupyterHub the hub "
              "signs people in", file=sys.stderr)
        return 2
    from .service.db import DatabaseError
    try:
        limits = ServiceLimits(max_connections=args.max_connections,
                               header_timeout=args.header_timeout,
                               body_timeout=args.body_timeout, max_cells=args.max_cells,
                               learner_jobs=args.learner_jobs,
                               learner_bytes=int(args.learner_storage * MiB),
                               stuck_after=max(ServiceLimits.stuck_after, 2 * args.timeout))
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
    if args.scheduler:
        from .cluster import Cluster, ClusterError
        try:
            with Cluster(args.scheduler, retries=args.retries, kernel=args.kernel,
                         notebooks=service.notebooks()) as cluster:
                options = cluster.resolve(grade_options(args, hidden=service.hidden()))
                return service.run(cluster, options, args.host, args.port)
        except ClusterError as error:  # unreachable, no workers, workers that differ
            print(f"error: {error}", file=sys.stderr)
            return 2
    spawner = _open_spawner(args, service.notebooks())
    from .grade import LocalRunner
    with LocalRunner(args.jobs, args.kernel, spawner=spawner) as runner:
        options = runner.resolve(grade_options(args, hidden=service.hidden()))
        return service.run(runner, options, args.host, args.port)


def run_submit(args: argparse.Namespace) -> int:
    from .submit import SubmitError, all_passed, render, upload, wait
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
    from .gradescope import build, describe
    from .grade import planned_tests
    from .layout import Course
    from .options import CPU, Limits
    try:
        course = Course.discover(args.course)
        out = args.out or course.root / "_build" / "gradescope" / f"{args.assignment}.zip"
        built = build(course, args.assignment, out,
                      Limits(cell=args.cell_timeout, notebook=args.timeout))
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
    from .grade import LocalRunner
    from .mutants import format_report, run_mutants as mutate
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


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
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
    return run_check(args)
