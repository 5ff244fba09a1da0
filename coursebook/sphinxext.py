"""Sphinx extension of the course book: launch links, published notebooks, and the status page.

Loaded by ``_config.yml`` (``sphinx.local_extensions``, which puts the repository's root on
``sys.path``: this package is not installed). It does three jobs, and makes the tables of
the assignments from their manifest (``assignments-table`` and ``wrong-submissions-table``, see
:mod:`coursebook.assignments`).

**Notebooks for the chapters.** The chapters are MyST Markdown files, and Colab
and Binder open only ``.ipynb`` files. sphinx-book-theme already copies each
executed chapter to ``_build/html/_sources/<page>.ipynb`` for its download
button, but its launch buttons point at ``<page>.ipynb`` *in the repository*,
which does not exist for a ``.md`` page. So at the end of the build this
extension writes the notebook people should open (the executed chapter, with
the outputs of this build and a first cell that installs ``dlperf`` where it is
missing) to ``_sources/<page>.ipynb``, made to stand on its own where the book's
Sphinx extensions are missing (:func:`self_contained`: the code that
``literalinclude`` directives show is written in, and ``{glue:text}`` roles become
the values this build glued), and points the Colab and Binder buttons
of those pages at that file on the branch the built book is published to
(``dlperf_pages_branch``, ``gh-pages``: ``.github/workflows/book.yml`` pushes
``_build/html`` there). Binder builds its environment from that branch too,
from the ``binder/requirements.txt`` written here. Pages that *are* notebooks
in the repository (the assignments) keep the theme's links to ``main``.
:func:`launch_links` is the one place where these URLs are made; the
``launch-links`` directive puts the same links on any page.

**The status page.** The ``course-status`` directive leaves a placeholder that
is filled in when the page is *written*, after every page of the build has been
read (and executed, or taken from the jupyter-cache). So the table is right on
the first build of a clean clone, whatever order the pages are read in. For
each executed page it shows what myst-nb recorded (when it ran, how long it
took) and the line ``dlperf.page_setup()`` printed in its first cell (run
profile, PyTorch and Python versions, hardware), read from the page's executed
outputs. The page is rewritten on every build, because its content depends on
other pages. The runs measured on GPUs, which the machine building the book
usually lacks, come from ``status/gpu-runs.json`` (see :mod:`coursebook.status`).
The same records are written to ``_build/html/status.json``.
"""
from __future__ import annotations

import copy
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from . import assignments
from .status import environment

LOGGER = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
GPU_RUNS = Path("status") / "gpu-runs.json"   # relative to the book's source folder

# The first cell of every published chapter notebook. In the course's own
# environment dlperf is installed and the cell does nothing.
SETUP_CELL = '''\
# Colab and Binder: install the course's helper package, dlperf, where it is missing.
import importlib.util

if importlib.util.find_spec("dlperf") is None:
    %pip install --quiet "dlperf @ git+{repo_url}@{branch}"'''

# Binder's environment for the published notebooks: what dlperf declares it needs
# (pyproject.toml), at the versions requirements.txt pins; CPU wheels of PyTorch.


# --- launch links ---------------------------------------------------------------------------

def _repository(app: Sphinx) -> Optional[Dict[str, str]]:
    options = app.config.html_theme_options
    url = options.get("repository_url", "").rstrip("/")
    match = re.match(r"https://github\.com/([^/]+)/([^/]+)$", url)
    if not match:
        return None
    return {"url": url, "org": match[1], "repo": match[2],
            "branch": options.get("repository_branch") or "main"}


def launch_links(app: Sphinx, path: str) -> Dict[str, str]:
    """``{"Colab": url, "Binder": url}`` for ``path``, a notebook of the repository or of the site.

    ``path`` is either a notebook committed to the repository (``exercises/a/a.ipynb``)
    or the published copy of a chapter (``_sources/chapters/x.ipynb``), which lives on
    the ``dlperf_pages_branch`` of the repository.
    """
    repo = _repository(app)
    if repo is None:
        return {}
    branch = app.config.dlperf_pages_branch if path.startswith("_sources/") else repo["branch"]
    options = app.config.html_theme_options.get("launch_buttons", {})
    interface = {"classic": "tree", "jupyterlab": "lab/tree"}[
        options.get("notebook_interface", "jupyterlab")]
    links = {}
    colab = options.get("colab_url", "").rstrip("/")
    if colab:
        links["Colab"] = f"{colab}/github/{repo['org']}/{repo['repo']}/blob/{branch}/{path}"
    binder = options.get("binderhub_url", "").rstrip("/")
    if binder:
        links["Binder"] = (f"{binder}/v2/gh/{repo['org']}/{repo['repo']}/{branch}"
                           f"?urlpath={quote(f'{interface}/{path}')}")
    return links


def _is_markdown_notebook(app: Sphinx, pagename: str, context: Dict[str, Any]) -> bool:
    return ("kernelspec" in app.env.metadata.get(pagename, {})
            and context.get("sourcename", "").endswith((".md", ".md.txt")))


def rewrite_launch_buttons(app: Sphinx, pagename: str, templatename: str,
                           context: Dict[str, Any], doctree) -> None:
    """Point the Colab and Binder buttons of a MyST chapter at its published notebook."""
    if not _is_markdown_notebook(app, pagename, context):
        return
    links = launch_links(app, f"_sources/{pagename}.ipynb")
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        for button in group["buttons"]:
            if button.get("text") in links:
                button["url"] = links[button["text"]]


class LaunchLinks(SphinxDirective):
    """``launch-links`` *notebook*: download, Colab and Binder links for a repository notebook.

    The argument is the notebook's path from the book's root, e.g.
    ``exercises/benchmark/benchmark.ipynb``.
    """

    required_arguments = 1

    def run(self):
        path = self.arguments[0].strip("/")
        if not (Path(self.env.srcdir) / path).exists():
            raise self.error(f"launch-links: {path} does not exist")
        self.env.note_dependency(str(Path(self.env.srcdir) / path))
        from sphinx import addnodes
        items = nodes.bullet_list(classes=["dlperf-launch-links"])
        download = addnodes.download_reference(
            "", "", nodes.literal(text=Path(path).name), refdoc=self.env.docname,
            reftarget="/" + path, refexplicit=True, refdomain="", reftype="download")
        entry = nodes.paragraph("", "Download the notebook ")
        entry += download
        entry += nodes.Text(" and open it in your own JupyterLab.")
        items += nodes.list_item("", entry)
        names = {"Colab": "Google Colab", "Binder": "Binder (JupyterLab in the browser)"}
        for name, url in launch_links(self.env.app, path).items():
            entry = nodes.paragraph("", "Open it in ")
            entry += nodes.reference("", names[name], refuri=url)
            entry += nodes.Text(".")
            items += nodes.list_item("", entry)
        return [items]


def publish_notebooks(app: Sphinx, exception: Optional[Exception]) -> None:
    """Write the notebook of each MyST chapter, and Binder's environment, into the site."""
    if exception is not None or app.builder.format != "html":
        return
    import nbformat
    out = Path(app.outdir)
    repo = _repository(app)
    for pagename in sorted(app.env.found_docs):
        if not ("kernelspec" in app.env.metadata.get(pagename, {})
                and str(app.env.doc2path(pagename)).endswith(".md")):
            continue
        executed = out.parent / "jupyter_execute" / f"{pagename}.ipynb"
        if not executed.exists():
            continue
        nb = _with_cached_outputs(app, nbformat.read(executed, as_version=4))
        glue_file = executed.with_name(f"{executed.stem}.glue.json")
        glued = json.loads(glue_file.read_text()) if glue_file.exists() else {}
        nb = self_contained(nb, Path(app.env.doc2path(pagename)).parent, glued, app.config)
        if repo is not None:
            setup = nbformat.v4.new_code_cell(
                SETUP_CELL.format(repo_url=repo["url"], branch=repo["branch"]))
            setup.metadata["tags"] = ["dlperf-setup"]
            nb.cells.insert(0, setup)
        nb.metadata.pop("jupytext", None)
        target = out / "_sources" / f"{pagename}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
    _write_binder_environment(app, out)


LITERALINCLUDE = re.compile(
    r"^(?P<fence>`{3,}|~{3,})\{literalinclude\}[ \t]+(?P<path>\S+)[ \t]*\n"
    r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL)
GLUE_TEXT = re.compile(r"\{glue:text\}`(?P<key>[^`:]+)(?::(?P<spec>[^`]*))?`")


def _included(path: str, options: str, folder: Path, config) -> tuple:
    """(language, text) that a literalinclude with these options shows, as Sphinx reads it."""
    from sphinx.directives.code import LiteralIncludeReader
    parsed = {}
    for line in options.splitlines():
        match = re.match(r"\s*:([\w-]+):\s*(.*)", line)
        if match:
            key, value = match[1], match[2].strip()
            parsed[key] = int(value) if key in ("dedent", "lineno-start") and value else value
    text, _ = LiteralIncludeReader(str((folder / path).resolve()), parsed, config).read()
    return parsed.get("language", ""), text


def self_contained(nb, folder: Path, glued: Dict[str, Any], config):
    """The chapter notebook, readable without the book's Sphinx extensions.

    Colab, Binder and JupyterLab show a markdown cell's MyST directives and roles as raw
    text, so: the code of each ``literalinclude`` is written into the cell as a fenced
    block (shown, as on the page, not run: it is the course's own code, which the
    notebook imports), and each ``{glue:text}`` role becomes the value this build glued,
    formatted as myst-nb formats it. (Run as a notebook, ``dlperf.glue`` prints each
    value the reader's own run measured.)
    """
    from myst_nb.core.variables import format_plain_text

    def include(match) -> str:
        language, text = _included(match["path"], match["options"], folder, config)
        fence = "`" * max(3, len(match["fence"]))
        return f"{fence}{language}\n{text.rstrip()}\n{fence}"

    def value(match) -> str:
        output = glued.get(match["key"])
        if output is None or "text/plain" not in output.get("data", {}):
            return match[0]
        return format_plain_text(output["data"]["text/plain"], match["spec"] or "")

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = GLUE_TEXT.sub(value, LITERALINCLUDE.sub(include, cell.source))
    return nb


def _with_cached_outputs(app: Sphinx, nb):
    """The executed notebook with its outputs (myst-nb drops them on a cache hit)."""
    if any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"):
        return nb
    # myst-nb's default, as in myst_nb.sphinx_ext, when execute.cache is not set
    cache_path = app.config.nb_execution_cache_path or str(Path(app.outdir).parent / ".jupyter_cache")
    if not Path(cache_path).exists():
        return nb
    try:
        from jupyter_cache import get_cache
        _, merged = get_cache(cache_path).merge_match_into_notebook(copy.deepcopy(nb))
        return merged
    except (KeyError, OSError, ValueError):
        return nb


def requirement_name(requirement: str) -> str:
    """The package name of a requirement line (``"numpy>=2,<3"`` -> ``"numpy"``)."""
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0]


def binder_requirements(source: Path) -> List[str]:
    """dlperf's dependencies (pyproject.toml), pinned as requirements.txt pins them."""
    import tomllib
    declared = tomllib.loads((source / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    requirements = source / "requirements.txt"
    for line in requirements.read_text().splitlines() if requirements.exists() else []:
        name = requirement_name(line)
        if name and not name.startswith(("#", "-")):
            pins[name.lower()] = line.strip()
    return [pins.get(requirement_name(r).lower(), r) for r in declared]


def _write_binder_environment(app: Sphinx, out: Path) -> None:
    source = Path(app.srcdir)
    if not (source / "pyproject.toml").exists():
        return
    lines = ["# Binder's environment for the published chapter notebooks; written by the book build",
             "# (coursebook/sphinxext.py) from pyproject.toml and requirements.txt. Each notebook",
             "# installs dlperf itself.",
             "--extra-index-url https://download.pytorch.org/whl/cpu",
             *binder_requirements(source)]
    (out / "binder").mkdir(exist_ok=True)
    (out / "binder" / "requirements.txt").write_text("\n".join(lines) + "\n")
    (out / ".nojekyll").touch()  # GitHub Pages must serve _static/ and _sources/ as they are


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str,
                           context: Dict[str, Any], doctree) -> None:
    """Load each script once per page.

    With Sphinx 7.4, sphinx-togglebutton's and sphinx-thebe's inline scripts end up
    twice in every page, and the second ``const THEBE_JS_URL = ...`` is a
    JavaScript SyntaxError in the reader's browser (tests/test_book_browser.py).
    """
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, unique = set(), []
    for script in scripts:
        key = (str(getattr(script, "filename", script) or ""),  # None and "" both mean inline
               getattr(script, "attributes", {}).get("body"))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


# --- the assignments' tables -----------------------------------------------------------------

class _ManifestTable(SphinxDirective):
    """A table made from ``assignments/assignments.toml`` (:mod:`coursebook.assignments`)."""

    def make(self, root: Path) -> str:
        raise NotImplementedError

    def depends_on(self, root: Path) -> List[Path]:
        return [root / assignments.MANIFEST] + [root / a.solution for a in assignments.load(root)]

    def run(self):
        root = Path(self.env.srcdir)
        try:
            text = self.make(root)
            for path in self.depends_on(root):
                self.env.note_dependency(str(path))
        except (OSError, ValueError) as error:
            raise self.error(f"{self.name}: {error}")
        holder = nodes.container()
        self.state.nested_parse(StringList(text.splitlines(), source=str(assignments.MANIFEST)),
                                self.content_offset, holder)
        return holder.children


class AssignmentsTable(_ManifestTable):
    """``assignments-table``: one row per assignment; ``:columns:`` from
    :data:`coursebook.assignments.COLUMNS` (default: page, writes, chapters, points)."""

    option_spec = {"columns": directives.unchanged}

    def make(self, root: Path) -> str:
        columns = self.options.get("columns", "page, writes, chapters, points")
        return assignments.table(root, [c.strip() for c in columns.split(",") if c.strip()])


class WrongSubmissionsTable(_ManifestTable):
    """``wrong-submissions-table``: each wrong submission of tests/wrong_submissions, with its
    mistake and the points it loses."""

    def make(self, root: Path) -> str:
        return assignments.mistakes_table(root)

    def depends_on(self, root: Path) -> List[Path]:
        return super().depends_on(root) + sorted((root / assignments.WRONG_SUBMISSIONS).glob("*/*.toml"))


# --- status page ----------------------------------------------------------------------------

class StatusPlaceholder(nodes.General, nodes.Element):
    """Where the ``course-status`` directive's tables go once every page has been read."""


class CourseStatus(SphinxDirective):
    """``course-status``: tables of the latest run of every executed page, and of the GPU runs."""

    option_spec = {"gpu-runs": directives.unchanged}

    def run(self):
        docs = getattr(self.env, "dlperf_status_docs", set())
        self.env.dlperf_status_docs = docs | {self.env.docname}
        return [StatusPlaceholder(gpu_runs=self.options.get("gpu-runs", str(GPU_RUNS)))]


def record_run(app: Sphinx, doctree: nodes.document) -> None:
    """After a page is read: remember how it ran (myst-nb's record, and its environment line)."""
    from myst_nb.sphinx_ import NbMetadataCollector
    env = app.env
    data = NbMetadataCollector.get_exec_data(env, env.docname)
    runs = getattr(env, "dlperf_runs", {})
    runs.pop(env.docname, None)
    if data:
        found = {}
        for node in doctree.findall(nodes.literal_block):
            found = environment(node.astext())
            if found:
                break
        title = env.titles.get(env.docname)
        runs[env.docname] = {
            "page": env.docname,
            "title": title.astext() if title is not None else env.docname,
            "ran_at": (datetime.fromtimestamp(data["mtime"], timezone.utc).isoformat(timespec="seconds")
                       if data.get("mtime") else None),
            "seconds": round(data["runtime"], 1) if data.get("runtime") is not None else None,
            "succeeded": bool(data.get("succeeded")),
            **found,
        }
    env.dlperf_runs = runs


def purge_doc(app: Sphinx, env, docname: str) -> None:
    getattr(env, "dlperf_runs", {}).pop(docname, None)
    getattr(env, "dlperf_status_docs", set()).discard(docname)


def merge_info(app: Sphinx, env, docnames, other) -> None:
    env.dlperf_runs = {**getattr(env, "dlperf_runs", {}),
                       **{d: r for d, r in getattr(other, "dlperf_runs", {}).items() if d in docnames}}
    env.dlperf_status_docs = (getattr(env, "dlperf_status_docs", set())
                              | (getattr(other, "dlperf_status_docs", set()) & set(docnames)))


def status_pages(app: Sphinx, env) -> List[str]:
    """Status pages are written on every build: their content comes from the other pages."""
    return sorted(getattr(env, "dlperf_status_docs", set()))


def load_gpu_runs(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("runs", [])


def _table(header: List[str], rows: List[List[nodes.Node]]) -> nodes.table:
    table = nodes.table(classes=["colwidths-auto", "dlperf-status"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)
    head = nodes.thead()
    group += head
    head += nodes.row("", *(nodes.entry("", nodes.paragraph(text=h)) for h in header))
    body = nodes.tbody()
    group += body
    for cells in rows:
        body += nodes.row("", *(nodes.entry("", nodes.paragraph("", "", cell)) for cell in cells))
    return table


def _page_link(app: Sphinx, fromdoc: str, run: Dict[str, Any]) -> nodes.Node:
    if run["page"] not in app.env.all_docs:
        return nodes.Text(run.get("title") or run["page"])
    return nodes.reference("", run.get("title") or run["page"],
                           refuri=app.builder.get_relative_uri(fromdoc, run["page"]))


def _fmt(value: Any, suffix: str = "") -> str:
    return "–" if value is None else f"{value}{suffix}"


class FillStatus(SphinxPostTransform):
    """Replace the placeholder with the tables (runs at write time, after all pages were read)."""

    default_priority = 8

    def run(self, **kwargs) -> None:
        app = self.app
        for node in list(self.document.findall(StatusPlaceholder)):
            runs = sorted(getattr(self.env, "dlperf_runs", {}).values(), key=lambda r: r["page"])
            rows = [[_page_link(app, self.env.docname, r), nodes.Text(_fmt(r.get("profile"))),
                     nodes.Text(_fmt(r.get("hardware"))), nodes.Text(_fmt(r.get("torch"))),
                     nodes.Text(_fmt(r.get("python"))), nodes.Text(_fmt(r.get("seconds"), " s")),
                     nodes.Text(_fmt(r.get("ran_at"))),
                     nodes.Text("ok" if r.get("succeeded") else "failed")] for r in runs]
            built = [nodes.paragraph(text=f"{len(runs)} executed page(s) in this build.")]
            if rows:
                built.append(_table(["Page", "Run profile", "Hardware", "PyTorch", "Python",
                                     "Run time", "Ran at (UTC)", "Result"], rows))
            gpu_runs = load_gpu_runs(Path(app.srcdir) / node["gpu_runs"])
            if gpu_runs:
                gpu_rows = [[_page_link(app, self.env.docname, r), nodes.Text(_fmt(r.get("profile"))),
                             nodes.Text(_fmt(r.get("hardware"))), nodes.Text(_fmt(r.get("torch"))),
                             nodes.Text(_fmt(r.get("python"))),
                             nodes.Text(_fmt(r.get("driver")) + (f" (CUDA {r['cuda']})" if r.get("cuda") else "")),
                             nodes.Text(_fmt(r.get("seconds"), " s")),
                             nodes.Text(_fmt(r.get("ran_at")))]
                            for r in sorted(gpu_runs, key=lambda r: (r["page"], r.get("ran_at") or ""))]
                gpu = [_table(["Page", "Run profile", "Hardware", "PyTorch", "Python", "Driver",
                               "Run time", "Ran at (UTC)"], gpu_rows)]
            else:
                gpu = [nodes.paragraph(text=f"No GPU run has been recorded yet ({node['gpu_runs']} "
                                            "is empty).")]
            section = nodes.container(classes=["dlperf-status-tables"])
            section += nodes.rubric(text="This build")
            section.extend(built)
            section += nodes.rubric(text="Measured on GPUs")
            section.extend(gpu)
            node.replace_self(section)


def write_status_json(app: Sphinx, exception: Optional[Exception]) -> None:
    if exception is not None or app.builder.format != "html":
        return
    runs = sorted(getattr(app.env, "dlperf_runs", {}).values(), key=lambda r: r["page"])
    (Path(app.outdir) / "status.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_config_value("dlperf_pages_branch", "gh-pages", "html")
    app.add_directive("launch-links", LaunchLinks)
    app.add_directive("assignments-table", AssignmentsTable)
    app.add_directive("wrong-submissions-table", WrongSubmissionsTable)
    app.add_node(StatusPlaceholder)
    app.add_directive("course-status", CourseStatus)
    app.add_post_transform(FillStatus)
    app.connect("html-page-context", rewrite_launch_buttons, priority=600)  # after the theme's (501)
    app.connect("html-page-context", drop_duplicate_scripts)
    app.connect("doctree-read", record_run)
    app.connect("env-purge-doc", purge_doc)
    app.connect("env-merge-info", merge_info)
    app.connect("env-updated", status_pages)
    app.connect("build-finished", publish_notebooks)
    app.connect("build-finished", write_status_json)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": 1}
