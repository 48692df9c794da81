"""The documentation site: it builds with every warning an error, it documents every
public name and command, and every ```python block of its pages runs.

The site is built once, by ``nox -s docs`` (``sphinx-build -n -W`` in a
virtualenv with the ``docs`` extra alone, as CI builds it) from a fresh
clone's files; the tests that read it are skipped without nox (``pip
install -e '.[dev]'``). The blocks run as
the README's do (`tests.markdown_blocks`); a block marked ``% no-run:``
is skipped with its reason.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import posixpath
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.markdown_blocks import python_blocks, run_block

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

PUBLIC_MODULES = [
    "pgqueue",
    "pgqueue.prometheus",
    "pgqueue.otel",
    "pgqueue.web",
    "pgqueue.testing",
    "pgqueue.testing.pytest_plugin",
    "pgqueue.sync",
    "pgqueue.sqlalchemy",
]
"""The modules whose ``__all__`` the reference documents."""

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's Chromium, which the browser check drives (never ``playwright install``)."""
HAVE_CHROMIUM = CHROMIUM.exists()

needs_site = pytest.mark.skipif(
    importlib.util.find_spec("nox") is None or not (ROOT / ".git").exists(),
    reason="the site is built by nox -s docs from a clone: pip install -e '.[dev]'"
    " in a git checkout",
)


def page_blocks() -> list[pytest.ParameterSet]:
    """The ```python blocks of every Markdown page of the site, named by file."""
    blocks = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.relative_to(DOCS).parts:
            continue
        name = page.relative_to(DOCS).with_suffix("").as_posix()
        prefix = re.sub(r"[^a-z0-9]+", "-", name.lower()) + "-"
        blocks += python_blocks(page.read_text(encoding="utf-8"), prefix)
    return blocks


BLOCKS = page_blocks()


def fresh_clone(target: Path) -> Path:
    """The checkout's files as a fresh clone has them, in ``target``.

    Tracked files and new ones git does not ignore, as they are in the work
    tree: no virtualenv, no earlier build, no generated inventory.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # not a deletion still in the index
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``nox -s docs`` builds it from a fresh clone (the docs extra alone)."""
    clone = fresh_clone(tmp_path_factory.mktemp("clone"))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    result = subprocess.run(
        [sys.executable, "-m", "nox", "--non-interactive", "-s", "docs"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, (
        f"nox -s docs failed ({result.returncode}):\n{result.stderr[-6000:]}"
    )
    return clone / ".nox" / "docs" / "tmp" / "html"


def inventory(site: Path) -> dict[str, set[str]]:
    """Each role's names in the site's ``objects.inv``."""
    from sphinx.util.inventory import InventoryFile

    with (site / "objects.inv").open("rb") as stream:
        data = InventoryFile.load(stream, "", posixpath.join)
    return {role: set(names) for role, names in data.items()}


def commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each subcommand of ``parser`` (``("jobs", "list")``) and its parser."""
    found = []
    for action in parser._actions:  # argparse has no public walk of its parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(((*prefix, name), sub))
                found += commands(sub, (*prefix, name))
    return found


@needs_site
@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_site_builds_without_a_warning(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "cli.html").is_file()


@needs_site
@pytest.mark.slow
@pytest.mark.timeout(660)
@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_in_the_inventory(site: Path, module_name: str) -> None:
    documented = set().union(
        *(v for k, v in inventory(site).items() if k.startswith("py:"))
    )
    module = importlib.import_module(module_name)
    missing = [
        f"{module_name}.{name}"
        for name in module.__all__
        if f"{module_name}.{name}" not in documented
    ]
    assert missing == []


@needs_site
@pytest.mark.slow
@pytest.mark.timeout(660)
def test_every_command_and_flag_is_on_the_cli_page(site: Path) -> None:
    from pgqueue.cli import build_parser

    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    names = inventory(site)
    found = commands(build_parser())
    assert {"worker", "schema", "jobs", "web"} <= {path[0] for path, _ in found}
    for path, parser in found:
        command = " ".join(("pgqueue", *path))
        slug = "-".join(path)
        assert f'id="cli-{slug}"' in page, command
        assert command in page, command
        assert f"cli-{slug}" in names["std:label"], command
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # hidden: how a parent passes settings to its children
            for option in action.option_strings:
                assert f"pgqueue-{slug}.{option}" in names["std:cmdoption"], (
                    f"{command} {option}"
                )


def test_no_run_blocks_are_skipped_with_their_reason() -> None:
    text = (
        "# Guide\n\n```python\nprint(1)\n```\n\n"
        "## A fragment\n\n% no-run: a fragment of the app\n```python\nworker.run()\n```\n\n"
        "```sh\nexit 1\n```\n"
    )
    blocks = python_blocks(text, "guide-")
    assert [block.id for block in blocks] == ["guide-1-guide", "guide-2-a-fragment"]
    assert not blocks[0].marks
    [skip] = blocks[1].marks
    assert skip.kwargs["reason"] == "no-run (guide-2-a-fragment): a fragment of the app"


def test_a_no_run_marker_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        python_blocks("% no-run:\n```python\npass\n```\n")


@pytest.mark.parametrize("code", BLOCKS)
async def test_docs_block_runs(code: str, fresh_dsn: str, tmp_path: Path) -> None:
    await run_block(code, fresh_dsn, tmp_path)


CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""Headless Chromium as root, with nothing fetched from outside."""

SEARCHES = {
    "after": "howto/workflows.html",
    "enqueue_many": "howto/enqueue.html",
    "rate limit": "howto/flow-control.html",
    "unknown types": "howto/workers.html",
    "PgBouncer": "howto/pgbouncer.html",
    "Celery": "howto/from-celery.html",
    "cron": "howto/periodic-jobs.html",
    "Django": "howto/django.html",
    "SQLAlchemy": "howto/sqlalchemy.html",
    "Prometheus": "howto/metrics-and-tracing.html",
    "failover": "howto/high-availability.html",
}
"""A guide's main term, and the guide the site's search must find for it."""

SCREENSHOTS = {
    "docs-front.png": "index.html",
    "docs-guide.png": "howto/workflows.html",
    "docs-reference.png": "reference/api/working.html",
}
"""Saved in docs/screenshots/: the front page, a guide, a reference page."""


@contextlib.asynccontextmanager
async def served(site: Path) -> AsyncIterator[str]:
    """The built site over HTTP on a free port; its base address."""
    uvicorn = pytest.importorskip("uvicorn", reason="the browser check needs uvicorn")
    from starlette.staticfiles import StaticFiles

    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            StaticFiles(directory=site, html=True), log_level="warning", lifespan="off"
        )
    )
    with listener:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve, [listener])
            try:
                yield f"http://127.0.0.1:{listener.getsockname()[1]}"
            finally:
                server.should_exit = True


@needs_site
@pytest.mark.slow
@pytest.mark.timeout(660)
async def test_the_site_navigates_searches_and_is_photographed_in_chromium(
    site: Path,
) -> None:
    """Served over HTTP, the built site's navigation and search work in a real browser."""
    playwright_api = pytest.importorskip(
        "playwright.async_api", reason="the browser check needs playwright"
    )
    if not HAVE_CHROMIUM:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    expect = playwright_api.expect
    async with served(site) as base, playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{base}/index.html")
            await expect(page).to_have_title(re.compile("pgqueue"))
            # The front page: a runnable example, the reasons, the features.
            await expect(page.locator("div.highlight-python").first).to_be_visible()
            await expect(page.locator("table").first).to_be_visible()
            # The sidebar leads to every section, the guides in their groups.
            tree = page.locator(".sidebar-tree")
            for group in ("Produce", "Work", "Operate", "Integrate", "Scale"):
                await expect(tree).to_contain_text(group)
            for section in ("Tutorial", "How-to guides", "Reference"):
                await tree.get_by_role("link", name=section, exact=True).click()
                await expect(page).to_have_title(re.compile(section[:8]))
            for name, path in SCREENSHOTS.items():
                await page.goto(f"{base}/{path}")
                await expect(page.locator("article")).to_be_visible()
                shot = await page.screenshot(path=str(DOCS / "screenshots" / name))
                assert shot.startswith(b"\x89PNG"), name
            # Search finds each guide by its main term.
            for term, guide in SEARCHES.items():
                await page.goto(f"{base}/search.html?q={term}")
                results = page.locator("#search-results")
                link = results.locator(f'a[href*="{guide}"]').first
                await expect(link, f"{term!r} finds {guide}").to_be_visible(
                    timeout=10_000
                )
        finally:
            await browser.close()


SHELL_FENCE = re.compile(
    r"^```(?:sh|bash|console)\n(.*?)^```$", re.MULTILINE | re.DOTALL
)

RUNNABLE = (
    ("schema", "check"),
    ("stats",),
    ("jobs", "list"),
    ("periodic", "list"),
    ("enqueue",),
)
"""Commands a shell line of the site may start with and that run alone on a
fresh database: they read, or add one job (and exit 0, or 1 for a schema
check that finds something to apply)."""


def pgqueue_lines() -> list[pytest.ParameterSet]:
    """Each ``pgqueue ...`` line of the site's shell blocks, with its page."""
    lines = []
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.relative_to(DOCS).parts:
            continue
        name = page.relative_to(DOCS).with_suffix("").as_posix()
        for block in SHELL_FENCE.finditer(page.read_text(encoding="utf-8")):
            for line in block[1].splitlines():
                command = line.split(" #", 1)[0].strip()
                if command.startswith("pgqueue ") and "$" not in command:
                    lines.append(pytest.param(command, id=f"{name}: {command[:60]}"))
    return lines


LINES = pgqueue_lines()


def test_the_site_shows_pgqueue_commands() -> None:
    assert len(LINES) >= 20


@pytest.mark.parametrize("line", LINES)
async def test_a_pgqueue_command_of_the_site_parses_and_runs_where_it_can(
    line: str, fresh_dsn: str
) -> None:
    """Every command line parses with the real parser; the read-only ones run too."""
    from pgqueue.cli import build_parser

    words = shlex.split(line)[1:]
    try:
        build_parser().parse_args(words)
    except SystemExit as exc:  # argparse's way of refusing
        pytest.fail(f"{line!r} does not parse (exit {exc.code})")
    if not any(tuple(words[: len(start)]) == start for start in RUNNABLE):
        return
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *words],
            env={**os.environ, "PGQUEUE_DSN": fresh_dsn},
            check=False,
        )
    allowed = {0, 1} if words[:2] == ["schema", "check"] else {0}
    assert result.returncode in allowed, (
        f"{line!r} exited {result.returncode}:\n{result.stderr.decode()}"
    )
