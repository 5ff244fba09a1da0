"""The built book as a reader's browser shows it: headless Chromium walks every page of the toc.

The book is served by Python's http.server on a free loopback port. Every page of
the table of contents is opened; a JavaScript error, a console error, a file of the
site that fails to load, a broken image, a broken internal link or an error output
cell fails the test. The search box is used as a reader would, and screenshots of
the landing page and of one chapter are saved to ``_build/screenshots/``. The student
edition shows learners the page on handing in and no page of the instructor guide; the
instructor edition is opened too, and every page of its guide is walked the same way.

Chromium is Debian's ``chromium`` package; the test installs it with apt-get when
it is missing, and is skipped (saying why) only where that is impossible.
"""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import pytest

from tests.browser import serve
from tests.test_book import guide_lines, toc_files

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "_build" / "screenshots"
SEARCH_WORD = "allreduce"  # in a chapter and in the assignments
pytestmark = pytest.mark.integration

PAGE_REPORT = """(() => {
  const outputs = [...document.querySelectorAll('.cell_output .output')];
  return {
    title: document.title,
    links: [...document.querySelectorAll('a[href]')].map(a => a.href)
             .filter(h => h.startsWith(location.origin)),
    toc: [...document.querySelectorAll('nav.bd-docs-nav a.reference.internal')].map(a => a.href),
    errors: outputs.filter(o => o.classList.contains('traceback') || o.classList.contains('error')
                               || o.textContent.includes('Traceback (most recent call last)'))
                   .map(o => o.textContent.slice(0, 300)),
  };
})()"""

# Every image of the page, lazy ones included, must load and decode.
BROKEN_IMAGES = """Promise.all([...document.images].map(img => {
  img.loading = 'eager';
  return img.decode().then(() => null, () => img.currentSrc || img.src);
})).then(found => found.filter(Boolean))"""


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book.html) as url:
        yield url


def landing_navigation(browser, site) -> list:
    """The pages the landing page's navigation leads to, the landing page first."""
    browser.open(site)  # index.html sends the reader on to the root page of the toc
    browser.wait_until("document.readyState === 'complete' && location.pathname.endsWith('intro.html')")
    landing = browser.evaluate(PAGE_REPORT)
    return [urldefrag(site)[0] + "intro.html"] + [u for u in dict.fromkeys(
        urldefrag(h)[0] for h in landing["toc"]) if u != site + "intro.html"]


def walk_pages(browser, site, pages) -> dict:
    """Open each page; what each showed, by its path in the site."""
    reports = {}
    for url in pages:
        browser.open(url)
        report = browser.evaluate(PAGE_REPORT)
        report["broken_images"] = browser.evaluate(BROKEN_IMAGES)
        report["problems"] = browser.problems(site)
        reports[url[len(site):]] = report
    return reports


def broken_links(links) -> list:
    """Each link that answers with an HTTP error, or names an anchor its page lacks."""
    bodies = {}
    broken = []
    for link in sorted(links):
        url, fragment = urldefrag(link)
        if url not in bodies:
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    bodies[url] = answer.read().decode("utf-8", "replace")
            except urllib.error.HTTPError as error:
                bodies[url] = None
                broken.append(f"{link}: HTTP {error.code}")
                continue
        body = bodies[url]
        if body is not None and fragment and url.endswith(".html") and \
                f'id="{fragment}"' not in body and f"id='{fragment}'" not in body:
            broken.append(f"{link}: no element with id {fragment!r}")
    return broken


@pytest.fixture(scope="module")
def walk(browser, site):
    """Open every page of the toc, starting from the landing page; what each page showed."""
    return walk_pages(browser, site, landing_navigation(browser, site))


def test_every_page_of_the_toc_is_reachable_from_the_landing_page(walk):
    walked = {page.removesuffix(".html") for page in walk}
    missing = [name for name in toc_files() if name not in walked]
    assert not missing, f"not in the landing page's navigation: {missing}"


def test_no_page_has_a_javascript_error_or_failed_load(walk):
    problems = {page: r["problems"] for page, r in walk.items() if r["problems"]}
    assert not problems, problems


def test_no_page_has_a_broken_image(walk):
    broken = {page: r["broken_images"] for page, r in walk.items() if r["broken_images"]}
    assert not broken, broken


def test_no_page_shows_an_error_output(walk):
    errors = {page: r["errors"] for page, r in walk.items() if r["errors"]}
    assert not errors, errors


def test_no_internal_link_is_broken(walk, site):
    links = {link for r in walk.values() for link in r["links"]}
    assert len(links) > len(walk), "the pages have hardly any links; was the site served?"
    broken = broken_links(links)
    assert not broken, "\n".join(broken)


def test_learners_find_the_handing_in_page_and_no_instructor_guide(walk, site):
    page = walk.get("assignments/handing-in.html")
    assert page, "the student edition's navigation does not lead to assignments/handing-in"
    assert page["title"].startswith("Handing in"), page["title"]
    assert site + "assignments/index.html" in page["links"]
    into_guide = {link for r in walk.values() for link in r["links"] + r["toc"]
                  if link.startswith(site + "guide/")}
    assert not into_guide, into_guide
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(site + "guide/index.html", timeout=10)


@pytest.fixture(scope="module")
def instructor_site(instructor_book):
    with serve(instructor_book.html) as url:
        yield url


@pytest.fixture(scope="module")
def guide_walk(browser, instructor_site):
    """The instructor edition's guide, every page of it, reached from its landing page."""
    site = instructor_site
    guide = [url for url in landing_navigation(browser, site) if url.startswith(site + "guide/")]
    return walk_pages(browser, site, guide)


def test_the_instructor_edition_opens_every_page_of_the_guide(guide_walk, instructor_site):
    assert [page.removesuffix(".html") for page in guide_walk] == list(guide_lines())
    for name, report in guide_walk.items():
        assert not report["problems"], (name, report["problems"])
        assert not report["broken_images"], (name, report["broken_images"])
        assert not report["errors"], (name, report["errors"])
    titles = [report["title"] for report in guide_walk.values()]
    assert titles[0].startswith("Instructor guide"), titles
    broken = broken_links({link for r in guide_walk.values() for link in r["links"]})
    assert not broken, "\n".join(broken)


def test_search_box_finds_a_word_of_the_book(browser, site):
    browser.open(site + "intro.html")
    browser.evaluate("document.querySelector('button.search-button__button').click()")
    browser.wait_until("document.activeElement && document.activeElement.type === 'search'")
    browser.call("Input.insertText", text=SEARCH_WORD)
    browser.events.clear()
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))
    browser.wait_for("Page.loadEventFired")
    assert browser.evaluate("location.pathname").endswith("search.html")
    summary = browser.wait_until(  # results arrive one by one; this line comes when all are in
        "(document.querySelector('#search-results .search-summary') || {}).textContent"
        " && /finished/i.test(document.querySelector('#search-results .search-summary').textContent)"
        " && document.querySelector('#search-results .search-summary').textContent", timeout=60)
    hits = browser.evaluate(
        "[...document.querySelectorAll('#search-results ul.search li a')].map(a => a.href)")
    pages = {urldefrag(h)[0][len(site):] for h in hits}
    assert {"chapters/multiple-gpus.html", "chapters/parameter-server.html"} <= pages, (summary, pages)
    assert not browser.problems(site), browser.problems(site)


def test_screenshots_of_the_landing_page_and_a_chapter(browser, site):
    shots = {"landing.png": "intro.html", "chapter-hybridize.png": "chapters/hybridize.html"}
    for name, page in shots.items():
        browser.open(urljoin(site, page))
        browser.wait_until("document.fonts ? document.fonts.ready.then(() => true) : true")
        path = browser.screenshot(SCREENSHOTS / name)
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000, f"{path}: not a real screenshot"
