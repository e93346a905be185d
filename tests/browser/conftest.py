"""Browser tests: headless Chromium from Debian's ``chromium`` package, driven by Playwright
for Python (pinned in pyproject to the release whose browser matches it). Playwright's own
browser download is never used: the browser is launched with ``executable_path``.

A missing Chromium FAILS the tests with what to install (``make test`` installs it); it
never skips them. ``ALLOT_CHROMIUM`` overrides the path (default ``/usr/bin/chromium``).

Screenshots are test artifacts: written under ``$ALLOT_TEST_ARTIFACTS/screenshots`` when
that is set (CI uploads the folder), else under pytest's temporary directory; the folder is
printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

CHROMIUM_ENV = "ALLOT_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
ARTIFACTS_ENV = "ALLOT_TEST_ARTIFACTS"

_shots: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives headless Chromium (Debian's chromium) with Playwright"
    )


def chromium_path() -> str:
    """The Chromium to launch, or a test failure saying how to get one."""
    path = os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM
    found = shutil.which(path)
    if found is None:
        pytest.fail(
            f"Chromium not found at {path!r}: the browser tests need Debian's chromium "
            f"(`apt-get install chromium`, as `make test` does) or ${CHROMIUM_ENV} pointing at "
            "a Chromium matching Playwright 1.64.1 (Chromium 156). Playwright's own browser "
            "download is never used.",
            pytrace=False,
        )
    return found


# Module scope, not session: Playwright's sync API keeps an event loop running in the test
# thread while it is open, and pytest-asyncio cannot run the async tests of later modules
# in a thread with a running loop.
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    args = ["--disable-dev-shm-usage", "--disable-gpu"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to sandbox as root
    browser = playwright.chromium.launch(executable_path=chromium_path(), args=args)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="session")
def screenshot(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Page, str], Path]:
    """``screenshot(page, name)`` saves a full-page PNG as a test artifact."""
    base = os.environ.get(ARTIFACTS_ENV)
    folder = Path(base) / "screenshots" if base else tmp_path_factory.getbasetemp() / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)

    def save(page: Page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000, f"screenshot {path} is empty"
        _shots.append(path)
        return path

    return save


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _shots:
        folder = _shots[0].parent
        terminalreporter.write_line(
            f"browser screenshots ({len(_shots)}): {folder} [{', '.join(p.name for p in _shots)}]"
        )
