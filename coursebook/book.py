"""Build the book exactly as `make book`, CI and the tests do.

``python -m coursebook`` (``make book``) runs ``jupyter-book build`` with warnings as errors,
then says which pages were executed and which came from the cache, how long it
took, and where the execution reports are when something failed. After a
successful build it checks every internal link of the HTML (:func:`broken_links`):
Sphinx's nitpicky mode catches broken cross-references in the sources, this
catches everything else (theme links, downloads, images, anchors) in what
readers get. A broken link fails the build.

``python -m coursebook --instructor`` (``make instructor-book``) builds the instructor edition instead
(:func:`build_instructor`).
"""
from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from . import assignments

ROOT = Path(__file__).resolve().parent.parent
BUILD_FLAGS = ["-n", "-W", "--keep-going"]  # nitpicky, warnings are errors, report them all


@dataclass
class BuildResult:
    returncode: int
    seconds: float
    log: str
    executed: List[str] = field(default_factory=list)
    cached: List[str] = field(default_factory=list)
    html: Path = ROOT / "_build" / "html"
    _broken: Optional[List[str]] = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.broken_links

    @property
    def broken_links(self) -> List[str]:
        """Internal links of the built HTML that lead nowhere (empty unless the build succeeded)."""
        if self.returncode != 0 or not self.html.exists():
            return []
        if self._broken is None:
            self._broken = broken_links(self.html)
        return self._broken

    def reports(self) -> str:
        """The tracebacks jupyter-book saved for pages whose execution failed."""
        folder = self.html / "reports"
        logs = sorted(folder.rglob("*.err.log")) if folder.exists() else []
        return "\n".join(f"--- {p.relative_to(self.html)}\n{p.read_text()}" for p in logs)


class _Links(HTMLParser):
    """The ids of a page and the local URLs it refers to (links, images, scripts, styles)."""

    ATTRIBUTES = {"a": "href", "link": "href", "img": "src", "script": "src", "source": "src",
                  "iframe": "src"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: Set[str] = set()
        self.urls: List[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        url = attrs.get(self.ATTRIBUTES.get(tag, ""))
        if url is not None:
            self.urls.append(url)


def broken_links(html: Path) -> List[str]:
    """``"page.html -> target"`` for every local link, image or script of the site that is missing.

    A link is local when it has no scheme and no host; it must name a file of the
    site (a folder means its ``index.html``), and an ``#anchor`` into an HTML page
    must be an ``id`` on that page.
    """
    html = Path(html).resolve()
    parsed: Dict[Path, _Links] = {}

    def parse(page: Path) -> _Links:
        if page not in parsed:
            parser = _Links()
            parser.feed(page.read_text(errors="replace"))
            parsed[page] = parser
        return parsed[page]

    broken = []
    for page in sorted(html.rglob("*.html")):
        if "_static" in page.relative_to(html).parts:
            continue
        for url in parse(page).urls:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith("//") or not url.strip():
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            try:
                target.relative_to(html)
            except ValueError:
                broken.append(f"{page.relative_to(html)} -> {url} (outside the site)")
                continue
            if not target.is_file():
                broken.append(f"{page.relative_to(html)} -> {url}")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parse(target).ids:
                broken.append(f"{page.relative_to(html)} -> {url} (no such anchor)")
    return broken


def command(root: Path = ROOT, *extra: str) -> List[str]:
    exe = Path(sys.executable).with_name("jupyter-book")
    return [str(exe), "build", str(root), *BUILD_FLAGS, *extra]


def _merge(base, extra):
    """``extra`` over ``base``: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(extra, dict):
        return {**base, **{key: _merge(base.get(key), value) for key, value in extra.items()}}
    return extra


def instructor_sources(root: Path = ROOT) -> Tuple[Path, Path]:
    """Write the instructor edition's config and toc (student ones + ``_instructor.yml``).

    The solution notebook of each assignment of ``assignments/assignments.toml``
    (:mod:`coursebook.assignments`) is appended to the last part ``_instructor.yml`` adds.
    They go to ``_build/instructor/``. The execution cache is the student build's
    (``_build/.jupyter_cache``, an absolute path), so a chapter executed for one
    edition is a cache hit for the other.
    """
    import yaml
    root = Path(root).resolve()
    extra = yaml.safe_load((root / "_instructor.yml").read_text())
    config = _merge(yaml.safe_load((root / "_config.yml").read_text()), extra.get("config", {}))
    config.setdefault("execute", {})["cache"] = str(root / "_build" / ".jupyter_cache")
    # Jupyter Book reads local_extensions' paths from the config file's folder: make them absolute.
    local = config.get("sphinx", {}).get("local_extensions") or {}
    for name, path in local.items():
        local[name] = str((root / path).resolve())
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = extra.get("parts", [])
    if parts:  # the solutions of the manifest's assignments close the last part of the additions
        parts[-1].setdefault("chapters", []).extend(
            {"file": page} for page in assignments.solution_pages(root))
    toc["parts"] = toc.get("parts", []) + parts
    folder = root / "_build" / "instructor"
    folder.mkdir(parents=True, exist_ok=True)
    header = "# Generated by coursebook.book from _config.yml, _toc.yml and _instructor.yml: do not edit.\n"
    (folder / "_config.yml").write_text(header + yaml.safe_dump(config, sort_keys=False))
    (folder / "_toc.yml").write_text(header + yaml.safe_dump(toc, sort_keys=False))
    return folder / "_config.yml", folder / "_toc.yml"


def build_instructor(root: Path = ROOT, echo: bool = True, env: Optional[dict] = None) -> BuildResult:
    """Build the instructor edition into ``_build/instructor/_build/html``."""
    root = Path(root).resolve()
    config, toc = instructor_sources(root)
    folder = config.parent
    return build(root, echo, env, extra=["--config", str(config), "--toc", str(toc),
                                         "--path-output", str(folder)],
                 html=folder / "_build" / "html")


def build(root: Path = ROOT, echo: bool = True, env: Optional[dict] = None,
          extra: Tuple[str, ...] = (), html: Optional[Path] = None) -> BuildResult:
    start = time.perf_counter()
    process = subprocess.Popen(command(root, *extra), cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    process.wait()
    log = "".join(lines)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)  # without the terminal colours
    return BuildResult(
        returncode=process.returncode,
        seconds=time.perf_counter() - start,
        log=plain,
        executed=re.findall(r"^(\S+): Executing notebook", plain, re.M),
        cached=re.findall(r"^(\S+): Using cached notebook", plain, re.M),
        html=html or Path(root) / "_build" / "html",
    )


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    instructor = "--instructor" in argv
    changed = assignments.sync(ROOT)  # _toc.yml and the grading workflow follow the manifest
    if changed:
        print(f"==> Updated from {assignments.MANIFEST}: {', '.join(map(str, changed))} (commit them)")
    result = build_instructor() if instructor else build()
    print(f"==> {'Instructor edition' if instructor else 'Book'} build {'succeeded' if result.ok else 'FAILED'} in {result.seconds:.0f} s: "
          f"{len(result.executed)} page(s) executed, {len(result.cached)} from the cache")
    if result.broken_links:
        print(f"==> {len(result.broken_links)} broken internal link(s):\n  "
              + "\n  ".join(result.broken_links))
    if result.ok:
        print(f"==> Open {result.html / 'index.html'}")
    elif result.reports():
        print("==> Execution reports:\n" + result.reports())
    return 0 if result.ok else (result.returncode or 1)


if __name__ == "__main__":
    sys.exit(main())
