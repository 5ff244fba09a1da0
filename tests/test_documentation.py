"""What the README and the instructor guide say, against what the course does.

The README is the short entry: it links into the guide, whose pages the instructor edition
shows (``_instructor.yml``). The guide's nbgrader steps are the commands the test run of the
course takes (tests/course_run.py); its table of ``grade``'s options is the parser's. What each
page says about a command's behaviour is tested where that behaviour is (they read the page
with :func:`tests.documentation.documentation`).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from autograder.commands import cli
from tests.course_run import instructor_commands
from tests.documentation import README, ROOT, book_pages, documentation

GUIDE = ROOT / "guide"
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")  # [text](target) of Markdown


def relative_links(page: str) -> list:
    return [target for target, _ in LINK.findall(documentation(page)) if "://" not in target]


def instructor_guide_part() -> list:
    additions = yaml.safe_load((ROOT / "_instructor.yml").read_text())
    parts = [part for part in additions["parts"] if part["caption"] == "Instructor guide"]
    assert len(parts) == 1, "_instructor.yml has one part 'Instructor guide'"
    return [entry["file"] for entry in parts[0]["chapters"]]


def test_every_page_of_the_guide_is_in_the_instructor_edition_only():
    pages = {f"guide/{path.stem}" for path in GUIDE.glob("*.md")}
    assert pages and set(instructor_guide_part()) == pages
    student = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert "guide" not in yaml.safe_dump(student), "a guide page in the student toc"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "guide" in config["exclude_patterns"], "the student edition must leave out guide/"


def test_the_readme_links_into_the_guide_and_every_link_leads_to_a_page():
    links = relative_links(README)
    assert set(links) >= {f"{name}.md" for name in instructor_guide_part() if name != "guide/index"}
    assert "assignments/handing-in.md" in links
    for target in links:
        assert (ROOT / target).is_file(), f"README links to {target}, which does not exist"


@pytest.mark.parametrize("page", sorted(f"guide/{path.name}" for path in GUIDE.glob("*.md")))
def test_a_guide_page_links_only_to_pages_of_the_book(page):
    """The book's build turns a link to a page into a link to its HTML; a link to any other
    file (the README, a module) would be broken in the built book."""
    for target in relative_links(page):
        resolved = (ROOT / page).parent.joinpath(target).resolve().relative_to(ROOT).as_posix()
        assert resolved in book_pages(), f"{page} links to {target}, which the book does not show"


def test_the_documentation_helper_refuses_a_page_no_reader_sees(tmp_path):
    assert documentation("guide/grader.md").startswith("# The grader")
    with pytest.raises(AssertionError, match="no reader is shown"):
        documentation("solutions/benchmark/benchmark.ipynb")


def shown_commands(page: str) -> list:
    """The commands of ``page``'s first ``bash`` block, each as the words after ``python -m``
    (``nbgrader X`` is ``python -m nbgrader X``); no comments, no ``export``."""
    block = re.search(r"```bash\n(.*?)```", documentation(page), re.S).group(1)
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] == "export":
            continue
        commands.append(tuple(words[2:] if words[:2] == ["python", "-m"] else words))
    return commands


def test_the_nbgrader_steps_are_the_commands_the_course_run_takes():
    assert shown_commands("guide/nbgrader.md") == instructor_commands("benchmark")


def options_table(page: str) -> dict:
    """flag -> (what it sets, default) of the table whose header is ``| option |``."""
    text = documentation(page)
    table = text[text.index("| option |"):]
    table = table[:table.index("\n\n")]
    rows = {}
    for line in table.splitlines()[2:]:
        option, what, default = [cell.strip() for cell in line.strip("|").split("|")]
        rows[option.strip("`").split()[0]] = (what, default)
    return rows


def grade_parser():
    top = cli.parser()
    commands = next(action for action in top._actions if action.dest == "command")
    return commands.choices["grade"]


def test_the_grader_page_lists_every_option_of_grade_with_its_default():
    rows = options_table("guide/grader.md")
    actions = {action.option_strings[0]: action for action in grade_parser()._actions
               if action.option_strings and action.option_strings[0] != "-h"
               and not action.required}
    assert set(rows) == set(actions)
    for flag, action in actions.items():
        default = rows[flag][1]
        if flag == "--jobs":
            assert default == "the number of cores"
        elif isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
            assert default.split()[0].rstrip(":") == f"{action.default:g}", (flag, default)
        elif isinstance(action.default, str):
            assert default.startswith(f"`{action.default}`"), (flag, default)


def test_the_learners_check_command_is_a_command_on_a_released_notebook():
    shown = re.findall(r"python -m autograder (check \S+)", documentation("assignments/handing-in.md"))
    assert shown, "the Handing-in page shows no check command"
    for command in shown:
        args = cli.parser().parse_args(command.split())
        assert (ROOT / args.notebook).is_file(), f"{command}: no such released notebook"
        assert Path(args.notebook).parts[0] == "exercises", command
