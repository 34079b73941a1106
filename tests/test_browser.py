"""In a real browser: the executed notebooks' charts draw in JupyterLab, a slider drives the knob panel
in a live kernel, and the ``investigate`` report renders offline.

``tests/test_notebooks.py`` proves the kernel side; these tests look at what a person sees, on the same
executed copies (``tests/notebook_runs.py``: each notebook runs once a session). Run just them with

    python -m pytest -q -m browser

They need Debian's Chromium (``apt-get install -y chromium``; another binary with ``TUNING_CHROMIUM``)
and the ``playwright`` package (test extra); no playwright browser download. Without them they skip
locally and fail in CI (``CI=true``). Screenshots go to ``test-artifacts/browser/`` (git-ignored; set
``TUNING_BROWSER_ARTIFACTS`` for another folder), next to the JupyterLab log.

Every request the page makes to a host other than loopback is blocked and fails the test, as does
any uncaught page error, a browser console error, or a cell error.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from tests.notebook_runs import checkout_env
from tuning.base.net import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.thirdparty, pytest.mark.xdist_group("browser")]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("TUNING_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TUNING_BROWSER_ARTIFACTS", ROOT / "test-artifacts" / "browser"))
LAUNCH_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
NOTEBOOKS = ("01-trend-sampling", "03-dataloader-tuning")  # executed copies: 01's trend and thread charts, 03's sweeps
PANEL = "knob-panel"  # a notebook of its own: the slider needs a live kernel, and 03 ran already
RUN_TIMEOUT_S = 300  # the panel notebook in quick mode (a few seconds when the cores are free)
# page-state waits poll on a clock, not on animation frames: a loaded or backgrounded page can go long between
# frames, and a frame-polled wait then never looks again
STATE_POLL_MS = 500

# Lab settings: no news pop-up over the page, no update check.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"browser test cannot run in CI: {reason}. .ci/run installs both "
                    "(apt-get install -y chromium; pip install -e '.[test]' for playwright)", pytrace=False)
    pytest.skip(reason)


def _stop(pids: list[int], grace_s: float = 10.0) -> None:
    """Terminate these processes by id (SIGTERM, then SIGKILL after ``grace_s``); gone ones are fine."""
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# --- the browser --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by playwright; closed and its processes stopped by id afterwards."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (it is in the test extra: pip install -e '.[test]')")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or point TUNING_CHROMIUM at one)")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    pw = sync_playwright().start()
    try:
        # generous: a loaded 2-core machine
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS, timeout=180_000)
    except Exception as exc:
        pw.stop()
        _unavailable(f"Chromium at {CHROMIUM} did not start: {str(exc).splitlines()[0]}")
    started = [p.pid for p in me.children(recursive=True) if p.pid not in before]  # driver + Chromium
    try:
        yield chromium
    finally:
        with contextlib.suppress(Exception):
            chromium.close()
        with contextlib.suppress(Exception):
            pw.stop()
        _stop(started, grace_s=5.0)


class Guard:
    """Watches one browser context: blocks and records any request to a non-loopback host, records
    uncaught page errors and console errors; :meth:`check` fails the test on any of them."""

    def __init__(self, context, allow_console: tuple[str, ...] = ()):
        self.offsite: list[str] = []
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        self.allow_console = allow_console
        context.route("**/*", self._route)
        context.add_init_script(f"window.__charts = {CHARTS_JS};")

    def _offsite(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") not in LOOPBACK

    def _route(self, route) -> None:
        url = route.request.url
        if self._offsite(url):
            self.offsite.append(url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def watch(self, page) -> None:
        page.on("pageerror", lambda exc: self.page_errors.append(f"{exc.name}: {exc.message}"))
        page.on("console", self._console)
        page.on("websocket", lambda ws: self._offsite(ws.url) and self.offsite.append(ws.url))

    def _console(self, msg) -> None:
        seen = f"{msg.text} {msg.location.get('url', '')}"
        if msg.type == "error" and not any(text in seen for text in self.allow_console):
            self.console_errors.append(f"{msg.text} ({msg.location.get('url', '')}:{msg.location.get('lineNumber', '')})")

    def check(self) -> None:
        assert not self.offsite, f"requests to hosts other than loopback: {self.offsite}"
        assert not self.page_errors, f"uncaught page errors: {self.page_errors}"
        assert not self.console_errors, f"console errors: {self.console_errors}"


# JS (``window.__charts(root)`` in every page the Guard watches): each plotly chart in ``root`` (or the
# document) and whether it drew.
CHARTS_JS = """(root) => Array.from((root || document).querySelectorAll('.js-plotly-plot')).map(gd => {
  const box = gd.getBoundingClientRect();
  const svg = gd.querySelector('.main-svg');
  return {
    id: gd.id || '',
    traces: Array.isArray(gd.data) ? gd.data.length : -1,
    drawn: Array.from(gd.querySelectorAll('g.trace')).filter(t => Array.from(t.querySelectorAll('path'))
      .some(p => (p.getAttribute('d') || '').length > 2)).length,  // traces with marks on screen
    svg: !!svg, width: Math.round(box.width), height: Math.round(box.height),
    title: (gd.querySelector('.gtitle') || {}).textContent || '',
  };
})"""


def _blank(charts: list[dict]) -> list[dict]:
    return [c for c in charts if not (c["svg"] and c["traces"] > 0 and c["drawn"] > 0
                                      and c["width"] > 50 and c["height"] > 50)]


# --- JupyterLab ---------------------------------------------------------------------------------

class Lab:
    def __init__(self, url: str, token: str, root: Path, proc: subprocess.Popen):
        self.url, self.token, self.root, self.proc = url, token, root, proc

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:  # loopback only
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")


def _panel_notebook() -> dict:
    """03's knob panel alone, on the real CPU, in quick mode: the cells a reader runs to try the knobs."""
    import nbformat

    cells = ["import tuning\nfrom tuning import viz, widgets\n\nviz.setup_notebook()\ndevice = tuning.device_for('cpu')",
             "panel = widgets.knob_panel(tuning.preset('baseline', device=device.knob).replace(batch_size=4), "
             "limit=48, device=device)\npanel"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c, id=f"panel-{i}") for i, c in enumerate(cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts, notebook_runs):
    """JupyterLab on 127.0.0.1 with a token; its own settings, workspaces, runtime and config folders;
    a temporary root holding the executed copies of NOTEBOOKS and the panel notebook (autosave there never
    touches the committed ones)."""
    import nbformat

    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    for name in NOTEBOOKS:
        run = notebook_runs(name)
        assert run.ok, f"{name} failed before the browser could show it:\n{run.failure}"
        shutil.copy(run.path, root / f"{name}.ipynb")
    nbformat.write(_panel_notebook(), root / f"{PANEL}.ipynb")
    settings = base / "settings"
    for rel, value in LAB_SETTINGS.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    for sub in ("workspaces", "runtime", "config"):
        (base / sub).mkdir()
    token, port = secrets.token_hex(16), free_port()
    env = checkout_env(TUNING_DEVICE="cpu", JUPYTERLAB_SETTINGS_DIR=str(settings),
                       JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"), JUPYTER_RUNTIME_DIR=str(base / "runtime"),
                       JUPYTER_CONFIG_DIR=str(base / "config"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.terminals_enabled=False",
           "--ServerApp.allow_root=True",  # CI runs as root
           "--LabApp.expose_app_in_browser=True", "--LabApp.extension_manager=readonly",  # no PyPI queries
           "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate"]
    log_path = artifacts / "jupyterlab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", token, root, proc)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}; log:\n{log_path.read_text()[-3000:]}")
            try:
                server.api("GET", "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in 90 s; log:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield server
    finally:
        kernels = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
        _stop([proc.pid])  # the server shuts its kernels down on SIGTERM ...
        _stop(kernels, grace_s=5.0)  # ... and any it left behind are stopped by id
        log.close()


# JS run in the page: the current notebook's code cells (execution count, running or not, errors,
# plotly outputs) and the kernel's status, from JupyterLab's own model (``expose_app_in_browser``).
NOTEBOOK_JS = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model || !panel.sessionContext) return null;
  const cells = [];
  for (const cell of panel.content.widgets) {
    const m = cell.model;
    if (m.type !== 'code') continue;
    const outputs = m.outputs.toJSON();
    cells.push({
      count: m.executionCount,
      running: m.executionState === 'running' || (cell.promptNode && cell.promptNode.textContent.includes('*')),
      errors: outputs.filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`),
      plotly: outputs.filter(o => o.data && o.data['application/vnd.plotly.v1+json']).length,
      widgets: outputs.filter(o => o.data && o.data['application/vnd.jupyter.widget-view+json']).length,
    });
  }
  return {kernel: panel.sessionContext.kernelDisplayStatus, cells};
}"""


def _open(page, lab: Lab, name: str) -> dict:
    """Open a notebook as saved (outputs included) and wait until all its code cells are in the page (a
    notebook still loading shows one empty cell); returns the notebook's state (see NOTEBOOK_JS)."""
    import nbformat

    code_cells = sum(c.cell_type == "code" for c in nbformat.read(lab.root / f"{name}.ipynb", as_version=4).cells)
    page.goto(f"{lab.url}/lab/tree/{name}.ipynb?reset&token={lab.token}")
    page.wait_for_function("n => { const s = (" + NOTEBOOK_JS + ")(); return s && s.cells.length === n; }",
                           arg=code_cells, timeout=180_000, polling=STATE_POLL_MS)  # generous: a loaded 2-core machine
    return page.evaluate(NOTEBOOK_JS)


def _open_and_run(page, lab: Lab, name: str) -> dict:
    """Open a notebook, wait for an idle kernel, Run > Run All Cells, wait until every cell has run
    (or one failed); returns the notebook's state (see NOTEBOOK_JS)."""
    page.goto(f"{lab.url}/lab/tree/{name}.ipynb?reset&token={lab.token}")
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=120_000)
    # "Python 3 | Idle"; generous: a loaded 2-core machine
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(timeout=180_000)
    page.wait_for_function("() => { const s = (" + NOTEBOOK_JS + ")(); return s && s.kernel === 'idle'; }",
                           timeout=180_000, polling=STATE_POLL_MS)  # generous: a loaded 2-core machine
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()
    page.wait_for_function(
        "() => { const s = (" + NOTEBOOK_JS + ")(); if (!s) return false;"
        " if (s.cells.some(c => c.errors.length)) return true;"
        " return s.kernel === 'idle' && s.cells.every(c => c.count !== null && !c.running); }",
        timeout=RUN_TIMEOUT_S * 1000, polling=STATE_POLL_MS)
    state = page.evaluate(NOTEBOOK_JS)
    errors = [e for c in state["cells"] for e in c["errors"]]
    assert not errors, f"{name}: cell errors: {errors}"
    return state


def _wait_for_charts(page, name: str, expected: int) -> list[dict]:
    """Scroll each chart's output into view (as a reader would) and wait until every one drew."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    page.wait_for_function(f"() => document.querySelectorAll('.jp-OutputArea .js-plotly-plot').length >= {expected}",
                           timeout=180_000, polling=STATE_POLL_MS)  # generous: a loaded 2-core machine
    charts = page.locator(".jp-OutputArea .js-plotly-plot")
    for i in range(charts.count()):
        chart = charts.nth(i)
        chart.scroll_into_view_if_needed(timeout=30_000)
        chart.locator(".main-svg").first.wait_for(state="attached", timeout=30_000)
    # waits on the charts' state: a live kernel's first measurement can take minutes on a loaded 2-core machine
    try:
        page.wait_for_function("() => { const c = window.__charts(); return c.length > 0 && c.every(x => x.svg"
                               " && x.traces > 0 && x.drawn > 0 && x.width > 50 && x.height > 50); }",
                               timeout=180_000, polling=STATE_POLL_MS)
    except PlaywrightTimeout as exc:
        said = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea .widget-html'))"
                             ".map(e => e.textContent)")  # a knob panel's status line says why it has no chart
        raise AssertionError(f"{name}: charts not drawn in 180 s: {page.evaluate('() => window.__charts()')}; "
                             f"widget text: {said}") from exc
    drawn = page.evaluate("() => window.__charts()")
    assert len(drawn) >= expected and not _blank(drawn), f"{name}: charts not drawn: {drawn}"
    return drawn


def _shot(locator_or_page, path: Path, **kw) -> None:
    locator_or_page.screenshot(path=str(path), **kw)


# JupyterLab's language-server extension asks its server part for /lsp/status; where that server extension is
# not enabled for this environment (a venv over the system's packages) the answer is a 404
LAB_CONSOLE_ALLOWED = ("/lsp/status",)


@contextlib.contextmanager
def _watched_page(browser, artifacts: Path, failure_shot: str, viewport=(1400, 1000), offline: bool = False,
                  allow_console: tuple[str, ...] = LAB_CONSOLE_ALLOWED):
    """A page in a fresh browser context, watched by a Guard; a full-page screenshot when the test fails."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, service_workers="block")
    context.set_offline(offline)
    guard = Guard(context, allow_console=allow_console)
    page = context.new_page()
    guard.watch(page)
    try:
        yield page, guard
    except BaseException:  # pytest.fail too
        with contextlib.suppress(Exception):
            _shot(page, artifacts / failure_shot, full_page=True)
        raise
    finally:
        context.close()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_executed_notebook_draws_its_charts(browser, lab, artifacts, name):
    """The executed copy opens in JupyterLab and every chart it saved draws, as a reader of a run notebook
    sees it (the plotly outputs render from the file; no cell runs again)."""
    try:
        with _watched_page(browser, artifacts, f"failure-{name[:2]}.png") as (page, guard):
            state = _open(page, lab, name)
            saved = sum(c["plotly"] for c in state["cells"])
            assert saved >= 2, f"{name}: the executed copy holds {saved} charts: {state}"
            assert not [e for c in state["cells"] for e in c["errors"]], state
            _wait_for_charts(page, name, saved)
            page.locator(".jp-OutputArea .js-plotly-plot").first.scroll_into_view_if_needed()
            _shot(page, artifacts / f"{name[:2]}-first-chart-in-lab.png")
            guard.check()
    finally:
        lab.shutdown_kernels()


def test_a_slider_drives_the_knob_panel(browser, lab, artifacts):
    """In a live kernel: the knob panel of 03 draws; moving its batch-size slider reruns the measurement and
    the chart on the page changes."""
    t0 = time.monotonic()
    with _watched_page(browser, artifacts, "failure-knob-panel.png") as (page, guard):
        state = _open_and_run(page, lab, PANEL)
        panels = [i for i, c in enumerate(state["cells"]) if c["widgets"]]
        assert panels, f"{PANEL}: no widget output (the knob panel) after running: {state}"
        _wait_for_charts(page, PANEL, 1)  # the panel's FigureWidget
        panel = page.locator(".jp-OutputArea-output").filter(has=page.locator(".noUi-handle")).last
        panel.scroll_into_view_if_needed()
        handles = panel.locator(".noUi-handle")
        handles.first.wait_for(state="visible", timeout=30_000)
        assert handles.count() >= 2, "the panel shows its sliders"
        figure = panel.locator(".js-plotly-plot").first
        figure.locator(".main-svg").first.wait_for(state="visible", timeout=30_000)
        before = figure.evaluate("gd => JSON.stringify(gd.data)")
        status_before = panel.locator(".widget-html").first.inner_text()
        _shot(panel, artifacts / "knob-panel-before.png")

        slider = panel.locator(".widget-slider, .jupyter-widget-slider, .widget-hslider").first
        label = slider.locator(".widget-label").first.inner_text() if slider.locator(".widget-label").count() else ""
        readout = slider.locator(".widget-readout").first
        value_before = readout.inner_text() if readout.count() else ""
        handle = handles.first
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        handle.focus()
        page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")  # one step (continuous_update=False: one run)
        if readout.count():
            page.wait_for_function("([el, v]) => el.innerText !== v", arg=[readout.element_handle(), value_before],
                                   timeout=10_000, polling=STATE_POLL_MS)
        figure.evaluate("(gd, before) => new Promise((resolve, reject) => {"
                        " const t0 = Date.now();"
                        " const tick = () => JSON.stringify(gd.data) !== before ? resolve(true)"
                        "   : Date.now() - t0 > 120000 ? reject(new Error('chart did not change in 120 s'))"
                        "   : setTimeout(tick, 250);"
                        " tick(); })", before)
        page.wait_for_function("el => /run 2/.test(el.innerText)", arg=panel.locator(".widget-html").first
                               .element_handle(), timeout=180_000, polling=STATE_POLL_MS)  # generous: a loaded 2-core machine
        after = figure.evaluate("gd => JSON.stringify(gd.data)")
        assert after != before
        drawn = _blank(figure.evaluate("gd => window.__charts(gd.parentElement)"))
        assert not drawn, f"the panel's chart is blank after the update: {drawn}"
        status_after = panel.locator(".widget-html").first.inner_text()
        assert status_after != status_before and "not measured" not in status_after, status_after
        page.wait_for_timeout(500)  # let plotly finish its transition before the picture
        _shot(panel, artifacts / "knob-panel-after-slider.png")
        print(f"slider {label!r} moved {value_before!r} -> {readout.inner_text() if readout.count() else '?'}; "
              f"status {status_after!r}")
        guard.check()
    assert time.monotonic() - t0 < 600, "the panel's round trip should take a few minutes at most"


# --- the investigate report ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def report(quick_investigation) -> Path:
    """The report of the run's one quick investigate (tests/investigation_run.py), shared with its own tests."""
    code, _, out = quick_investigation
    assert code in (0, 3)  # 3: no configuration met the target (the report says so)
    return out / "report.html"


SECTIONS_JS = """() => Array.from(document.querySelectorAll('section[data-section]')).map(s => ({
  key: s.id,
  figures: s.querySelectorAll('figure.chart').length,
  unavailable: s.querySelectorAll('p.note').length
    ? Array.from(s.querySelectorAll('p.note')).map(p => p.textContent).filter(t => t.includes('chart unavailable'))
    : [],
}))"""


def test_report_draws_every_chart_offline(browser, report, artifacts):
    """The report, opened from disk with the network cut: plotly.js loads from the page itself, every
    section's figure drew, and nothing tried to reach another host."""
    with _watched_page(browser, artifacts, "failure-report.png", viewport=(1300, 900), offline=True,
                       allow_console=()) as (page, guard):
        page.goto(report.as_uri(), wait_until="load")
        assert page.evaluate("() => typeof window.Plotly === 'object' && !!window.Plotly.newPlot"), \
            "plotly.js did not load from the page"
        sections = page.evaluate(SECTIONS_JS)
        keys = {s["key"] for s in sections}
        for key in ("trends", "ledger", "decision", "sweep", "what-if"):
            assert key in keys, f"section {key} missing: {sorted(keys)}"
        for s in sections:
            assert not s["unavailable"], f"{s['key']}: {s['unavailable']}"
        figures = sum(s["figures"] for s in sections)
        page.wait_for_function(f"() => document.querySelectorAll('figure.chart .js-plotly-plot .main-svg').length"
                               f" >= {figures}", timeout=30_000, polling=STATE_POLL_MS)
        per_figure = page.evaluate("() => Array.from(document.querySelectorAll('figure.chart')).map(f => ({"
                                   " section: f.closest('section').id, charts: window.__charts(f) }))")
        blank = [f for f in per_figure if len(f["charts"]) != 1 or _blank(f["charts"])]
        assert not blank, f"charts that did not draw: {blank}"
        for key in ("trends", "ledger", "decision", "sweep", "what-if"):
            assert any(f["section"] == key for f in per_figure), f"no chart in section {key}"
        _shot(page, artifacts / "report-full-page.png", full_page=True)
        page.locator("section#decision figure.chart").first.scroll_into_view_if_needed()
        _shot(page.locator("section#decision figure.chart").first, artifacts / "report-decision-chart.png")
        guard.check()


# JS: each chart's title, legend, plot area and annotations, relative to the chart's own box (issue 58,
# finding 9: at 1,280 px a title ran off the edge, a long legend squeezed the plot, capacity labels overlapped)
LEGIBLE_JS = """() => Array.from(document.querySelectorAll('figure.chart .js-plotly-plot')).map(gd => {
  const box = gd.getBoundingClientRect();
  const rel = el => { const r = el.getBoundingClientRect();
    return {left: r.left - box.left, right: r.right - box.left, top: r.top - box.top, bottom: r.bottom - box.top}; };
  const title = gd.querySelector('.gtitle');
  const plots = Array.from(gd.querySelectorAll('.draglayer .nsewdrag')).map(rel);
  return {
    section: gd.closest('section').id, width: box.width,
    title: title ? rel(title) : null, title_text: title ? title.textContent : '',
    plot_width: plots.length ? Math.max(...plots.map(p => p.right)) - Math.min(...plots.map(p => p.left)) : 0,
    annotations: Array.from(gd.querySelectorAll('g.annotation')).map(a => ({...rel(a), text: a.textContent})),
  };
})"""


def _overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] - 1 and b["left"] < a["right"] - 1 and a["top"] < b["bottom"] - 1 \
        and b["top"] < a["bottom"] - 1


def test_report_charts_are_legible_at_1280_px(browser, report, artifacts):
    """Every chart of the report in a 1,280 px window: its title inside its box, its plot area at least half
    its width (a legend does not squeeze it), and no two annotations printed over each other."""
    with _watched_page(browser, artifacts, "failure-report-1280.png", viewport=(1280, 900), offline=True,
                       allow_console=()) as (page, guard):
        page.goto(report.as_uri(), wait_until="load")
        figures = page.evaluate("() => document.querySelectorAll('figure.chart').length")
        page.wait_for_function(f"() => document.querySelectorAll('figure.chart .js-plotly-plot .main-svg').length"
                               f" >= {figures}", timeout=30_000, polling=STATE_POLL_MS)
        charts = page.evaluate(LEGIBLE_JS)
        assert charts
        for c in charts:
            where = f"{c['section']}: {c['title_text'][:60]!r}"
            if c["title"] is not None:
                assert c["title"]["left"] >= -1 and c["title"]["right"] <= c["width"] + 1, (where, c["title"])
            assert c["plot_width"] >= 0.5 * c["width"], (where, c["plot_width"], c["width"])
            notes = c["annotations"]
            clash = [(a["text"], b["text"]) for i, a in enumerate(notes) for b in notes[i + 1:] if _overlap(a, b)]
            assert not clash, (where, clash)
        _shot(page, artifacts / "report-1280.png", full_page=True)
        guard.check()
