"""Drive JupyterLab in headless Chromium: start the lab, open a notebook, run it, look at it.

The lab runs `tenantlab lab` headless against the suite's server (TENANTLAB_DATABASE_URL), on copies of the
notebooks (JupyterLab saves outputs into the files it runs), with private Jupyter and IPython
directories so nothing of the user's configuration takes part. The browser may only talk to the
lab: every other request is aborted and recorded, which is what "works with the network cut" means
for the charts and widgets.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tenantlab.server import free_port

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route, WebSocket

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}



def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> set[int]:
    """Return the pids of every living process below pid."""
    kids, found, todo = _children(), set(), [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Lab:
    """A running `tenantlab lab`: its URL, token, notebook copies and every process it started."""

    proc: subprocess.Popen
    port: int
    token: str
    notebooks: Path
    home: Path
    seen: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def notice_processes(self) -> None:
        """Remember the lab's processes (Jupyter, kernels, their workers) to check they all end."""
        self.seen |= descendants(self.proc.pid)

    def kernel_pids(self) -> set[int]:
        """Return the pids seen whose command line names a kernel connection file of this lab."""
        runtime = str(self.home / "runtime")
        pids = set()
        for pid in self.seen:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if runtime in cmd and "kernel" in cmd:
                pids.add(pid)
        return pids

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel) through the REST API, as the Kernel menu would."""
        self.notice_processes()
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.api("GET", "/api/kernels") or []:
            self.api("DELETE", f"/api/kernels/{kernel['id']}")


def _wait_ready(lab: Lab, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.proc.poll() is not None:
            raise RuntimeError(f"tenantlab lab ended early:\n{log.read_text()[-3000:]}")
        try:
            lab.api("GET", "/api/status")
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _private_jupyter(home: Path) -> dict[str, str]:
    dirs = {name: home / name for name in ("config", "data", "runtime", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True)
    # The tests drive the lab through its command registry (window.jupyterapp), like Galata does.
    (dirs["config"] / "jupyter_lab_config.json").write_text(
        json.dumps({"LabApp": {"expose_app_in_browser": True}}))
    # The news prompt is a toast over the first cells in every screenshot; it asks, fetches nothing.
    (dirs["config"] / "labconfig").mkdir()
    (dirs["config"] / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    # Every cell attached and laid out (the default skips painting cells out of view): the test
    # measures every chart and a tall screenshot shows the whole notebook.
    settings = dirs["config"] / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    return {"JUPYTER_CONFIG_DIR": str(dirs["config"]), "JUPYTER_DATA_DIR": str(dirs["data"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]), "IPYTHONDIR": str(dirs["ipython"]),
            "JUPYTER_PLATFORM_DIRS": "1"}


@contextmanager
def lab(admin_dsn: str, home: Path, notebooks: list[Path]) -> Iterator[Lab]:
    """Start `tenantlab lab` headless on copies of notebooks; stop it and every kernel after."""
    copies = home / "notebooks"
    copies.mkdir(parents=True)
    for path in notebooks:
        shutil.copy(path, copies / path.name)
    shutil.copy(NOTEBOOKS / "kit.py", copies / "kit.py")  # the notebooks' first import
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
    env.update(_private_jupyter(home), TENANTLAB_DATABASE_URL=admin_dsn, TENANTLAB_SIZE="workshop",
               TENANTLAB_NOTEBOOKS=str(copies))
    port, token = free_port(), "browser-test-token"
    log_path = home / "lab.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tenantlab", "lab", "--no-browser", "--port", str(port),
             "--token", token], env=env, stdout=log, stderr=subprocess.STDOUT)
        the_lab = Lab(proc=proc, port=port, token=token, notebooks=copies, home=home)
        try:
            _wait_ready(the_lab, log_path)
            yield the_lab
        finally:
            _stop(the_lab)


def _stop(lab: Lab) -> None:
    if lab.proc.poll() is None:
        try:
            lab.shutdown_kernels()
        except OSError:
            pass
        lab.notice_processes()
        lab.proc.send_signal(signal.SIGTERM)  # tenantlab lab stops Jupyter, Jupyter its kernels
        try:
            lab.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            lab.proc.kill()
            lab.proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in lab.seen):
        time.sleep(0.2)
    left = sorted(p for p in lab.seen if alive(p))
    for pid in left:  # do not leave them to the next test, but do fail this one
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        raise AssertionError(f"processes of the lab still running after it stopped: {left}")


class Offline:
    """A route handler: let requests to the lab through, abort and record all others."""

    def __init__(self) -> None:
        self.blocked: list[str] = []
        self.websockets: list[str] = []

    def route(self, route: Route) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if host in LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("internetdisconnected")

    def websocket(self, ws: WebSocket) -> None:
        if (urlsplit(ws.url).hostname or "") not in LOCAL_HOSTS:
            self.blocked.append(ws.url)
        self.websockets.append(ws.url)


# JavaScript run in the page. The lab is exposed as window.jupyterapp (see _private_jupyter).
JS_READY = """() => {
  const w = window.jupyterapp?.shell.currentWidget;
  const k = w?.sessionContext?.session?.kernel;
  return Boolean(k && k.status === 'idle' && w.content?.widgets.length);
}"""

JS_RUN_ALL = """() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"""

# Done: kernel idle, no cell waiting ([*]), and every non-empty code cell ran (or one failed:
# JupyterLab then stops and leaves the rest unrun).
JS_DONE = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session?.kernel;
  if (!k || k.status !== 'idle') return false;
  const code = w.content.widgets.filter(c => c.model.type === 'code');
  if (code.some(c => /\\[\\*\\]/.test(c.node.querySelector('.jp-InputPrompt')?.textContent || '')))
    return false;
  if (code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))) return true;
  return code.every(c => !c.model.sharedModel.getSource().trim() || c.model.executionCount !== null);
}"""

JS_CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets.map((cell, i) => {
    const m = cell.model;
    if (m.type !== 'code' || !m.sharedModel.getSource().trim()) return null;
    const outputs = m.outputs.toJSON();
    return {index: i, count: m.executionCount, source: m.sharedModel.getSource().slice(0, 80),
            errors: outputs.filter(o => o.output_type === 'error')
                           .map(o => `${o.ename}: ${o.evalue}`),
            // Python warnings (file:line: SomeWarning: ...) a participant would see in red.
            warnings: [...new Set(outputs
              .filter(o => o.output_type === 'stream' && o.name === 'stderr')
              .flatMap(o => (Array.isArray(o.text) ? o.text.join('') : o.text).split('\\n')
                .map((line, i, lines) => `${line} ${lines[i + 1] || ''}`.trim()))
              .filter(line => /^\\S+:\\d+: \\w*Warning: /.test(line)))]};
  }).filter(Boolean);
}"""

# Every Altair JupyterChart (an anywidget model with a "spec") and each of its views, found
# through the notebook's widget manager; and every Vega view anywhere in the notebook.
JS_CHARTS = """async () => {
  const hash = s => { let h = 0; for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
                      return h; };
  // vegaEmbed(el) makes the widget's own element the .vega-embed: look at it and below it.
  const embeds = root => [...(root.matches('.vega-embed') ? [root] : []),
                          ...root.querySelectorAll('.vega-embed')];
  const describe = root => embeds(root).map(embed => {
    const svg = embed.querySelector('svg.marks');
    const canvas = embed.querySelector('canvas.marks');
    const box = embed.getBoundingClientRect();
    return {svg: Boolean(svg), canvas: Boolean(canvas),
            marks: svg ? svg.querySelectorAll('[class*="mark-"]').length : 0,
            width: Math.round(box.width), height: Math.round(box.height),
            hash: svg ? hash(svg.outerHTML) : canvas ? hash(canvas.toDataURL()) : 0};
  });
  const panel = window.jupyterapp.shell.currentWidget;
  let manager = null;
  for (const cell of panel.content.widgets) {
    for (const out of cell.outputArea?.widgets || []) {
      for (const r of out.widgets || [out]) {
        if (!manager && r._manager) manager = await r._manager.promise;
      }
    }
  }
  const charts = [];
  if (manager) {
    for (const model of await Promise.all(Object.values(manager._models))) {
      if (model.get('_model_module') !== 'anywidget' || model.get('spec') === undefined) continue;
      const views = await Promise.all(Object.values(model.views || {}));
      for (const view of views) {
        const error = /JavaScript Error/.test(view.el.textContent) ? view.el.textContent : null;
        const cell = panel.content.widgets.findIndex(c => c.node.contains(view.el));
        charts.push({model: model.model_id, cell, error, embeds: describe(view.el)});
      }
    }
  }
  return {manager: Boolean(manager), charts, embeds: describe(panel.node)};
}"""

# Widget outputs that did not render: ipywidgets shows these texts instead of the view.
JS_BROKEN_WIDGETS = """() => Array.from(
    window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-OutputArea-output'))
  .map(e => e.textContent)
  .filter(t => /Error displaying widget|Loading widget\\.\\.\\.|JavaScript Error:/.test(t))
  .map(t => t.slice(0, 300))"""

# Outputs wider than their output area: a participant would have to scroll sideways (or the
# evidence is cut). Each entry names the cell, how wide the content is and how wide the area.
JS_OVERFLOW = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const out = [];
  cells.forEach((cell, index) => {
    cell.node.querySelectorAll('.jp-OutputArea-output').forEach(o => {
      if (o.scrollWidth > o.clientWidth + 2) {
        out.push({cell: index, content: o.scrollWidth, area: o.clientWidth,
                  text: (o.innerText || '').slice(0, 80)});
      }
    });
  });
  return out;
}"""

# Sliders too narrow to drag (a track under 100 px).
JS_NARROW_SLIDERS = """() => Array.from(document.querySelectorAll('.widget-slider'))
  .map(s => ({label: (s.querySelector('.widget-label')?.innerText || '').trim(),
              width: (s.querySelector('.noUi-target, .slider-container') || s)
                       .getBoundingClientRect().width}))
  .filter(s => s.width < 100)"""

# The file browser open, as a participant has it.
JS_OPEN_FILE_BROWSER = """() => { window.jupyterapp.commands.execute('filebrowser:activate'); }"""

JS_SCROLL_HEIGHT = """() => window.jupyterapp.shell.currentWidget.node
  .querySelector('.jp-WindowedPanel-outer').scrollHeight"""

JS_SCROLL_TOP = """() => { window.jupyterapp.shell.currentWidget.node
  .querySelector('.jp-WindowedPanel-outer').scrollTop = 0; }"""


def open_notebook(page: Page, lab: Lab, name: str, timeout: float = 120) -> None:
    """Open notebook name alone (?reset: no tab restored from before) and wait for its kernel."""
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}&reset")
    page.wait_for_function(JS_READY, timeout=timeout * 1000, polling=250)
    page.evaluate(JS_OPEN_FILE_BROWSER)


def run_all(page: Page, timeout: float) -> list[dict]:
    """Run All Cells through JupyterLab's command; wait until done; return the code cells."""
    page.evaluate(JS_RUN_ALL)
    page.wait_for_function(JS_DONE, timeout=timeout * 1000, polling=500)
    return page.evaluate(JS_CELLS)


def charts(page: Page, timeout: float = 60) -> dict:
    """Return the notebook's charts once every one drew (or timeout: the last look)."""
    deadline = time.monotonic() + timeout
    while True:
        found = page.evaluate(JS_CHARTS)
        drawn = all(c["embeds"] and all(e["marks"] or e["canvas"] for e in c["embeds"])
                    for c in found["charts"])
        if drawn or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def not_drawn(found: dict) -> list[str]:
    """Return why charts did not render (empty when every chart shows a Vega view with marks)."""
    problems = []
    for c in found["charts"]:
        if c["error"]:
            problems.append(f"chart {c['model']}: {c['error'][:200]}")
        elif not c["embeds"]:
            problems.append(f"chart {c['model']}: no Vega view in the widget")
        for e in c["embeds"]:
            if not (e["marks"] or e["canvas"]) or not (e["width"] and e["height"]):
                problems.append(f"chart {c['model']}: a Vega view without marks: {e}")
    for e in found["embeds"]:
        if not (e["marks"] or e["canvas"]):
            problems.append(f"a Vega view without marks: {e}")
    return problems


def screenshot(page: Page, path: Path) -> None:
    """Save the whole notebook: a window as tall as its content, for the one picture."""
    size = page.viewport_size
    height = min(page.evaluate(JS_SCROLL_HEIGHT) + 200, 16000)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        page.set_viewport_size({"width": size["width"], "height": max(height, size["height"])})
        page.evaluate(JS_SCROLL_TOP)  # JupyterLab keeps the last cell in view, at the bottom
        time.sleep(0.5)  # let charts sized to their container settle
        page.screenshot(path=str(path))
    finally:
        page.set_viewport_size(size)
