"""The Prefect UI in a real browser, as a user drives it: ``prefect server start`` and the
served deployments (``python -m deployments.serve``) on 127.0.0.1, headless Chromium (Debian's
package) driven by Playwright.

1. *Deployments → pipeline → Run → Custom run*: the form drawn from `PipelineConfig`,
   pre-filled from the recipe (4 training steps); the training steps set to 6; *Submit*.
2. The run completes (the whole job on the tiny target at test size); its page says Completed
   and shows its artifacts: the per-dataset statistics table, the training picture (of 6
   steps), the link to the evaluation report.
3. One extraction shard's data file is corrupted on disk; *Deployments →
   extract-retry-failed → Run → Quick run*; that run extracts that shard alone (the others are
   not even submitted), and the shard verifies again.

Screenshots of each step go to ``$EYAS_SCREENSHOTS`` when set (``docs/images`` for the docs),
else to the test's temporary folder. Selectors go by roles and visible text, except where
Prefect 3.9's UI gives none: its form labels are not tied to their inputs (``for`` names no
id), so a field is found from its label's text (`form_field`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from support.browser_fixtures import VIEWPORT, Screenshots, chromium_path, require_playwright
from support.fault_drill import drill_env, prefect_server
from support.paths import REPO
from support.pipeline_fixtures import small_recipe

from eyas.manifest import verify_manifest

RUN_NAME = "ui-test"
BROKEN = ("train", "shard-00001")
"""The shard the test corrupts: (split, folder under ``hidden/<split>/``)."""
RUN_TIMEOUT_S = 600.0
"""Longest wait for one flow run (the pipeline takes about a minute on 2 cores, four when
other work loads them heavily)."""

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.serve]


# -- the server, the deployments, the browser -----------------------------------------------
@contextlib.contextmanager
def served_deployments(recipe: Path, workdir: Path, env: dict[str, str], log_path: Path,
                       startup_s: float = 240.0):
    """``python -m deployments.serve`` for `recipe` and `workdir` against the server in `env`
    (no automatic retries: a failure must show, not be retried 5 minutes later), until every
    deployment is registered. Yields; then the process, and any flow run it still executes,
    is ended."""
    import psutil

    from deployments.serve import DEPLOYMENTS

    api = env["PREFECT_API_URL"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deployments.serve", "--config", str(recipe), "--workdir",
             str(workdir), "--no-auto-retry"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + startup_s
            while _deployment_ids(api).keys() < set(DEPLOYMENTS):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"deployments not served:\n{_tail(log_path)}")
                time.sleep(1.0)
            yield
        finally:
            children = []
            with contextlib.suppress(psutil.NoSuchProcess):
                children = psutil.Process(proc.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            alive = [p for p in children if p.is_running()]
            for p in alive:  # flow runs started in a session of their own, if any
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for p in psutil.wait_procs(alive, timeout=10)[1]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()


def _deployment_ids(api: str) -> dict[str, str]:
    """Deployment name -> id, as the server knows them ({} while it does not answer)."""
    try:
        deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    except httpx.HTTPError:
        return {}
    return {d["name"]: d["id"] for d in deps}


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


@pytest.fixture(scope="module")
def ui(request, tmp_path_factory):
    """A Prefect server with its UI, the deployments served for a test-size recipe, and a
    browser page: ``{"page", "base", "api", "workdir", "shoot", "serve_log", "startup_s"}``."""
    chromium = chromium_path()  # skip (fail in CI) before building or starting anything
    sync_api = require_playwright()
    request.getfixturevalue("tiny_target")
    started = time.monotonic()
    root = tmp_path_factory.mktemp("ui")
    recipe = small_recipe(root / "recipe.yaml", name=RUN_NAME)
    raw = yaml.safe_load(recipe.read_text())  # quicker on a busy machine, same shards
    raw["tokenize"]["num_proc"] = 1  # no worker processes to start for a few records
    next(d for d in raw["datasets"] if d["name"] == "demo_chat")["limit"] = 4  # fewer answers
    recipe.write_text(yaml.safe_dump(raw))
    workdir = root / "run"
    serve_log = root / "serve.log"
    with prefect_server(root / "prefect-home", ui=True) as api:
        env = drill_env(root / "prefect-home", api)
        with served_deployments(recipe, workdir, env, serve_log), \
                sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True,
                                        args=["--no-sandbox", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(60_000)  # a busy 2-core machine
                yield {"page": page, "base": api.removesuffix("/api"), "api": api,
                       "workdir": workdir, "serve_log": serve_log,
                       "startup_s": time.monotonic() - started,
                       "shoot": Screenshots(root / "screenshots")}
            finally:
                browser.close()


# -- what a user does in the UI --------------------------------------------------------------
def open_run_menu(ui: dict, deployment: str) -> None:
    """*Deployments → `deployment` → Run*: the menu with *Quick run* and *Custom run*."""
    page = ui["page"]
    page.goto(f"{ui['base']}/deployments")
    page.get_by_role("link", name=deployment, exact=True).click()
    page.get_by_role("button", name="Run", exact=True).click()


def form_field(page, label: str):
    """The input of the run form's field labelled `label` (innermost field with that label:
    nested sections contain their fields' labels too)."""
    field = page.locator(".p-label", has=page.get_by_text(label, exact=True)).last
    return field.locator("input, textarea").first


def _flow_run_ids(api: str, deployment_id: str) -> set[str]:
    """The ids of every flow run of one deployment, from the API."""
    runs = httpx.post(f"{api}/flow_runs/filter", timeout=10,
                      json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}}).json()
    return {r["id"] for r in runs}


def submit_and_view_run(ui: dict, deployment: str, submit, wait_s: float = 180.0) -> str:
    """Click `submit` (the form's *Submit*, the quick-run dialog's *Run*), then follow the run
    it created: the toast's *View run*, as a user does. The toast only lives a few seconds and
    a loaded 2-core machine can starve the browser past it (CI once waited 60 s for a toast
    already gone); then the one new run of `deployment` is found from the API and its page
    opened, as a user would from the deployment's runs. Returns the flow run's id; fails, with
    a screenshot, when the click created no run, or more than one."""
    page, api = ui["page"], ui["api"]
    timeout = require_playwright().TimeoutError
    deployment_id = _deployment_ids(api)[deployment]
    before = _flow_run_ids(api, deployment_id)
    submit.click()
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(timeout):
        page.get_by_role("button", name="View run").last.click(timeout=20_000)  # top toast
        page.wait_for_url(re.compile(r"/runs/flow-run/[0-9a-f-]{36}"), timeout=30_000)
    while not (created := _flow_run_ids(api, deployment_id) - before):
        if time.monotonic() > deadline:
            shot = ui["shoot"](page, f"no-run-{deployment}")
            raise AssertionError(f"{deployment}: submitting created no flow run in "
                                 f"{wait_s:.0f} s (the page: {page.url}, screenshot {shot})")
        time.sleep(1.0)
    assert len(created) == 1, f"{deployment}: one click created {len(created)} runs"
    (run_id,) = created
    if run_id not in page.url:  # the toast was missed
        page.goto(f"{ui['base']}/runs/flow-run/{run_id}")
    return run_id


def wait_final(ui: dict, flow_run_id: str) -> dict:
    """The flow run once it is final (Completed, Failed, Crashed, Cancelled), read from the
    API; fails with the serving process's log when it is not within `RUN_TIMEOUT_S`."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        run = httpx.get(f"{ui['api']}/flow_runs/{flow_run_id}", timeout=10).json()
        if run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"flow run {run['name']} still {run['state_name']} after "
                                 f"{RUN_TIMEOUT_S:.0f} s:\n{_tail(ui['serve_log'])}")
        time.sleep(2.0)


def open_run_page(ui: dict, flow_run_id: str, tab: str | None = None) -> None:
    """The flow run's page, said to be Completed; `tab` (e.g. ``Artifacts``) opened."""
    page = ui["page"]
    page.goto(f"{ui['base']}/runs/flow-run/{flow_run_id}")
    page.get_by_text("Completed", exact=True).first.wait_for()
    if tab:
        page.get_by_role("tablist").get_by_text(tab, exact=True).click()


def show_artifact_cards(ui: dict, flow_run_id: str) -> None:
    """The *Artifacts* tab with every card loaded (those of task runs come in below)."""
    page = ui["page"]
    open_run_page(ui, flow_run_id, "Artifacts")
    page.get_by_text("Task runs", exact=True).scroll_into_view_if_needed()


def open_artifact(ui: dict, flow_run_id: str, key: str) -> None:
    """An artifact's page, reached from its card on the run's *Artifacts* tab."""
    page = ui["page"]
    show_artifact_cards(ui, flow_run_id)
    page.get_by_text(key, exact=True).click()
    page.wait_for_url("**/artifacts/artifact/**")
    page.get_by_text(key, exact=True).first.wait_for()


def centre(locator) -> None:
    """Scroll `locator` to the middle of the window (for a screenshot)."""
    locator.evaluate("e => e.scrollIntoView({block: 'center'})")


def settle(page, seconds: float = 3.0) -> None:
    """Let the page finish loading and animating before a screenshot (nothing is asserted
    on what it draws on canvas)."""
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(seconds * 1000)


def task_run_states(ui: dict, flow_run_id: str) -> dict[str, str]:
    """Task run name -> state name of a flow run, from the API."""
    runs = httpx.post(f"{ui['api']}/task_runs/filter", timeout=10,
                      json={"flow_runs": {"id": {"any_": [flow_run_id]}}}).json()
    return {r["name"]: r["state_name"] for r in runs}


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- the test --------------------------------------------------------------------------------
def test_pipeline_from_its_form_then_retry_failed_shards_from_the_ui(ui, capsys):
    page, shoot, workdir = ui["page"], ui["shoot"], ui["workdir"]
    expect = require_playwright().expect

    # 1. The pipeline's form, pre-filled from the recipe: 4 training steps, changed to 6.
    open_run_menu(ui, "pipeline")
    page.get_by_text("Custom run", exact=True).click()
    page.wait_for_url("**/run?**")
    steps = form_field(page, "Steps (Optional)")
    expect(steps).to_have_value("4")
    steps.fill("6")
    centre(steps)
    shoot(page, "ui-pipeline-form")
    run_id = submit_and_view_run(ui, "pipeline", page.get_by_role("button", name="Submit"))
    run = wait_final(ui, run_id)
    assert run["parameters"]["config"]["train"]["steps"] == 6
    assert run["state_type"] == "COMPLETED", (run["state"], _tail(ui["serve_log"]))

    # 2. The completed run and its artifacts, as the UI shows them.
    open_run_page(ui, run_id)
    expect(page.get_by_text("eyas-pipeline", exact=True).first).to_be_visible()
    settle(page)  # the run's graph is drawn on a canvas, animated
    shoot(page, "ui-pipeline-run")
    show_artifact_cards(ui, run_id)
    for key in (f"{RUN_NAME}-datasets", f"train-{RUN_NAME}-summary",
                f"evaluate-{RUN_NAME}-report", f"pipeline-{RUN_NAME}"):
        expect(page.get_by_text(key, exact=True)).to_be_visible()
    centre(page.get_by_text(f"{RUN_NAME}-datasets", exact=True))
    shoot(page, "ui-pipeline-artifacts")

    open_artifact(ui, run_id, f"{RUN_NAME}-datasets")  # the statistics table
    table = page.get_by_role("table")
    for dataset in ("demo_chat", "demo_sharegpt", "demo_reasoning", "demo_long"):
        expect(table.get_by_text(dataset, exact=True)).to_be_visible()
    shoot(page, "ui-artifact-statistics")

    open_artifact(ui, run_id, f"train-{RUN_NAME}-summary")  # the training picture
    picture = page.get_by_role("img", name="loss and per-step accuracy")
    expect(picture).to_be_visible()
    assert picture.evaluate("img => img.complete && img.naturalWidth") > 0  # decoded, not broken
    expect(page.get_by_role("row", name="steps 6", exact=True)).to_be_visible()
    centre(picture)
    shoot(page, "ui-artifact-training")
    meta = json.loads((workdir / "drafter" / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 6  # the form's value reached the training

    open_artifact(ui, run_id, f"evaluate-{RUN_NAME}-report")  # the report's link
    report = workdir / "evaluate" / "report.html"
    link = page.get_by_role("link", name=str(report))
    expect(link).to_be_visible()
    assert link.get_attribute("href") == report.as_uri() and report.is_file()
    shoot(page, "ui-artifact-report")

    # 3. One shard broken on disk (same size, other bytes), then "retry failed shards".
    split, name = BROKEN
    hidden = workdir / "hidden"
    shard = hidden / split / name
    assert verify_manifest(shard) == []
    others = {s: file_hashes(s) for s in sorted(hidden.glob("*/shard-*")) if s != shard}
    assert len(others) >= 2, sorted(hidden.glob("*/shard-*"))
    data = shard / "data.safetensors"
    raw = bytearray(data.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    data.write_bytes(bytes(raw))
    assert verify_manifest(shard) != []

    open_run_menu(ui, "extract-retry-failed")
    page.get_by_text("Quick run", exact=True).click()
    retry_id = submit_and_view_run(
        ui, "extract-retry-failed",
        page.get_by_role("dialog").get_by_role("button", name="Run", exact=True))
    retry = wait_final(ui, retry_id)
    assert retry["parameters"]["only_failed"] is True
    assert retry["state_type"] == "COMPLETED", (retry["state"], _tail(ui["serve_log"]))
    states = task_run_states(ui, retry_id)
    ran = {k: v for k, v in states.items() if re.fullmatch(r"extract-\w+-shard-\d+", k)}
    assert ran == {f"extract-{split}-{name}": "Completed"}, states  # the others: not submitted
    assert verify_manifest(shard) == []
    assert {s: file_hashes(s) for s in others} == others  # untouched

    open_run_page(ui, retry_id)
    expect(page.get_by_text("extract-retry-failed", exact=True).first).to_be_visible()
    settle(page)
    shoot(page, "ui-retry-run")
    open_run_page(ui, retry_id, "Task Runs")  # the UI tells the same: one shard ran
    listed = page.get_by_text(re.compile(r"^extract-\w+-shard-\d+$"))
    expect(listed).to_have_count(1)
    expect(listed).to_have_text(f"extract-{split}-{name}")
    centre(listed)
    shoot(page, "ui-retry-tasks")
    with capsys.disabled():
        print(f"\nbrowser test: server and deployments up in {ui['startup_s']:.0f} s; pipeline "
              f"run {run['total_run_time']:.0f} s, retry run {retry['total_run_time']:.0f} s; "
              f"screenshots in {shoot.folder}")
