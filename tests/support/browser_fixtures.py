"""Headless Chromium for the tests marked ``browser``: Debian's ``chromium`` package, driven by
Playwright's Python package (never ``playwright install``: nothing is downloaded at run time).

Where the browser cannot be found, a browser test is skipped with the reason -- except in CI
(the environment variable ``CI`` set, as CI services do, or ``EYAS_REQUIRE_BROWSER=1``, which
``.ci/run`` sets), where it fails with what to install: there the browser tests must run.
``scripts/test.sh`` installs the package with apt-get when it is missing and it can.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_ENV = "EYAS_CHROMIUM"
"""An explicit browser executable; else ``chromium`` or ``chromium-browser`` on PATH."""
REQUIRE_ENV = "EYAS_REQUIRE_BROWSER"
"""Set to 1 to make a missing browser fail the browser tests instead of skipping them."""
SCREENSHOTS_ENV = "EYAS_SCREENSHOTS"
"""A folder (e.g. ``docs/images``) where the browser tests save their screenshots."""
VIEWPORT = {"width": 1280, "height": 800}


def browser_required() -> bool:
    """True in CI: a browser test without its browser fails instead of skipping."""
    flag = os.environ.get(REQUIRE_ENV, "").strip().lower()
    ci = os.environ.get("CI", "").strip().lower()
    return flag in {"1", "true", "yes"} or ci not in {"", "0", "false", "no"}


def _missing(what: str) -> None:
    """Skip, or in CI fail, saying what is missing and how to install it."""
    message = (f"{what} (the tests marked `browser` need Debian's Chromium and the Python "
               "package `playwright` of the dev extra: apt-get install chromium; "
               f"pip install -e '.[dev]'; or set {CHROMIUM_ENV} to a Chromium executable)")
    if browser_required():
        pytest.fail(f"{message}; required here (CI or {REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(message)


def chromium_path() -> str:
    """The Chromium executable, or a skip (a failure in CI) naming what to install."""
    explicit = os.environ.get(CHROMIUM_ENV)
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            _missing(f"{CHROMIUM_ENV}={explicit} is not an executable file")
        return explicit
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _missing("headless Chromium is not installed (no `chromium` on PATH)")
    return found


def require_playwright():
    """``playwright.sync_api``, or a skip (a failure in CI) naming what to install."""
    try:
        from playwright import sync_api
    except ImportError:
        _missing("the Python package `playwright` is not installed")
    return sync_api


class Screenshots:
    """Saves PNG screenshots of pages to `folder` (``$EYAS_SCREENSHOTS`` when set), reduced
    to a 128-colour palette: the UI's flat colours survive and each file stays near 50 KB."""

    def __init__(self, fallback: Path):
        self.folder = Path(os.environ.get(SCREENSHOTS_ENV) or fallback)
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, page, name: str) -> Path:
        from PIL import Image

        image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
        small = image.quantize(colors=128, method=Image.Quantize.MEDIANCUT,
                               dither=Image.Dither.NONE)
        path = self.folder / f"{name}.png"
        tmp = path.with_name(f".tmp-{path.name}")
        small.save(tmp, "PNG", optimize=True)
        tmp.replace(path)
        return path
