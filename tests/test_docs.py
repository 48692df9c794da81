"""The documentation site: it builds with every warning an error, it documents every
public name and command, and every ```python block of its pages runs.

The site is built once, with ``sphinx-build -n -W`` in a subprocess (as
``nox -s docs`` and CI build it); the tests that read it are skipped when
Sphinx is not installed (``pip install -e '.[docs]'``). The blocks run as
the README's do (`tests.markdown_blocks`); a block marked ``% no-run:``
is skipped with its reason.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import posixpath
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.markdown_blocks import python_blocks, run_block

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

needs_sphinx = pytest.mark.skipif(
    importlib.util.find_spec("sphinx") is None,
    reason="Sphinx is not installed: pip install -e '.[docs]' to build the site",
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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with ``-n -W`` (every reference resolved, no warning)."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-n",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(out / ".doctrees"),
            str(DOCS),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, (
        f"sphinx-build -n -W failed ({result.returncode}):\n{result.stderr}"
    )
    return out / "html"


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


@needs_sphinx
@pytest.mark.slow
@pytest.mark.timeout(660)
def test_the_site_builds_without_a_warning(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "cli.html").is_file()


@needs_sphinx
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


@needs_sphinx
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


@needs_sphinx
async def test_the_site_navigates_and_searches_in_chromium(site: Path) -> None:
    """Served over HTTP, the built site's navigation and search work in a real browser."""
    playwright_api = pytest.importorskip(
        "playwright.async_api", reason="the browser check needs playwright"
    )
    uvicorn = pytest.importorskip("uvicorn", reason="the browser check needs uvicorn")
    from starlette.staticfiles import StaticFiles

    if not HAVE_CHROMIUM:
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    expect = playwright_api.expect
    listener = socket.create_server(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(
            StaticFiles(directory=site, html=True), log_level="warning", lifespan="off"
        )
    )
    with listener:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve, [listener])
            try:
                async with playwright_api.async_playwright() as playwright:
                    browser = await playwright.chromium.launch(
                        executable_path=str(CHROMIUM)
                    )
                    try:
                        page = await browser.new_page()
                        await page.goto(f"{base}/index.html")
                        await expect(page).to_have_title(re.compile("pgqueue"))
                        # The sidebar leads to every section.
                        for section in ("Tutorial", "How-to guides", "Reference"):
                            await (
                                page.locator(".sidebar-tree")
                                .get_by_role("link", name=section, exact=True)
                                .click()
                            )
                            await expect(page).to_have_title(re.compile(section[:8]))
                        # Search finds the API by name.
                        await page.goto(f"{base}/search.html?q=enqueue_many")
                        results = page.locator("#search-results")
                        await expect(results.get_by_role("link").first).to_be_visible(
                            timeout=10_000
                        )
                        await expect(results).to_contain_text("enqueue_many")
                        if os.environ.get("PGQUEUE_SCREENSHOTS") == "1":
                            await page.screenshot(
                                path=str(DOCS / "screenshots" / "docs-search.png")
                            )
                    finally:
                        await browser.close()
            finally:
                server.should_exit = True


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
