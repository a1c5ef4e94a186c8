"""Open the MLflow UI on a study in headless Chromium and save a screenshot of its runs table.

    python scripts/ui_screenshot.py --study gradshare-tiny --out docs/mlflow-ui-runs-table.png \
        [--backend-store-uri sqlite:///mlflow.db]
    # one run's page instead: a run id, or `refused` for the study's newest refusal
    python scripts/ui_screenshot.py --study gradshare-tiny --run refused --out docs/mlflow-ui-refused-run.png

Starts `mlflow ui` as the README does (without MLflow's job runner) on a free loopback port
against the study's store, opens the study's runs table (`tracking.runs_table`) in Debian's
`chromium` (`apt-get install chromium`) and writes the PNG. The browser is driven over its
DevTools pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on file descriptors 3
and 4), so no browser-automation package is needed; only this browser's own storage is set
up (the columns shown, MLflow's assistant panel closed), never the study's store.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from gradshare.contract.tags import FAILURE, REFUSAL
from gradshare.tracking import connection
from gradshare.tracking import study_runs

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # gradshare from this checkout, installed or not (as study_md.py does)
    sys.path.insert(0, str(REPO))

# What the runs table shows of each run: the screens' words and the figures behind them (the
# analyze run), what a step cost (its train run), and a refusal's tag and reason.
COLUMNS = {"params.`quality_screen`": 125, "params.`speed_screen`": 115, "metrics.`verdict/speed_ratio`": 160,
           "metrics.`verdict/task_gain_pp`": 160, "metrics.`verdict/task_gain_lo_pp`": 170,
           "metrics.`verdict/retention_upper_nats`": 225, "metrics.`verdict/noninferior_single_lo_pp`": 240,
           "metrics.`verdict/noninferior_dense_lo_pp`": 240, "metrics.`cost/powersgd/usd`": 165,
           "metrics.`cost/powersgd/gpu_s_total`": 215, f"tags.`{REFUSAL}`": 130,
           f"tags.`{FAILURE}`": 520}  # column: its width in pixels


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol on a pipe."""

    def __init__(self, browser: str, profile: str, width: int, height: int):
        to_browser, self._to = os.pipe()
        self._from, from_browser = os.pipe()

        def on_3_and_4():  # duplicates first: the pipe's own numbers may be 3 or 4
            a, b = os.dup(to_browser), os.dup(from_browser)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", f"--window-size={width},{height}"],
            preexec_fn=on_3_and_4, close_fds=False, start_new_session=True,  # its helpers end with it
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._buf, self._id, self._session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self._session and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        while True:  # events arrive between the answers: skipped
            while b"\0" not in self._buf:
                chunk = os.read(self._from, 1 << 20)
                if not chunk:
                    raise SystemExit("chromium ended its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise SystemExit(f"chromium refused {method}: {reply['error']}")
                return reply.get("result", {})

    def text(self) -> str:
        got = self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                        returnByValue=True)
        return got.get("result", {}).get("value") or ""

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)  # the browser's own process group (its renderers)
        self.proc.wait(timeout=30)


def browser_storage(experiment_id: str, columns: dict[str, int]) -> dict[str, str]:
    """MLflow 3.17's UI keeps each experiment page's state (the columns shown, their order and
    widths) and its assistant panel in the browser's localStorage, under these keys."""
    state = {"selectedColumns": list(columns), "columnOrder": list(columns), "columnWidths": columns}
    return {f'MLflowLocalStorage-1.1-ExperimentPage-["{experiment_id}"]-ReactComponentState': json.dumps(state),
            "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true", "mlflow.assistant.panelOpen_v1": "false"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="gradshare-tiny")
    ap.add_argument("--out", default="mlflow-ui.png")
    ap.add_argument("--backend-store-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--run", default="", help="a run's page instead of the table: its id, or `refused` for "
                                                "the study's newest refusal (the runs table draws KILLED as FAILED)")
    ap.add_argument("--size", default="", help="width,height of the page in pixels (default 3000,600 for the "
                                                "table, 1500,560 for a run)")
    ap.add_argument("--wait-s", type=float, default=60, help="at most this long for the table to render")
    args = ap.parse_args(argv)

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    width, height = (int(x) for x in (args.size or ("1500,560" if args.run else "3000,600")).split(","))
    import mlflow

    from gradshare.tracking.server import NO_JOBS
    from gradshare.train.launch import free_port

    mlflow.set_tracking_uri(args.backend_store_uri)
    exp = mlflow.get_experiment_by_name(args.study)
    if exp is None:
        raise SystemExit(f"no study {args.study!r} in {args.backend_store_uri}")
    run_id = args.run
    if run_id == "refused":
        refused = connection.client().search_runs([exp.experiment_id], f"tags.`{REFUSAL}` = 'true'",
                                         order_by=["attributes.start_time DESC"], max_results=1)
        if not refused:
            raise SystemExit(f"study {args.study!r} has no refused run")
        run_id = refused[0].info.run_id
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", args.backend_store_uri,
                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **NO_JOBS})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("mlflow ui did not start")
        url = study_runs.runs_table(exp.experiment_id, base, run_id)
        rendered = "Status" if run_id else "matching runs"  # the run's overview; the table's footer
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
            page = DevTools(browser, profile, width, height)
            try:
                setup = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                                for k, v in browser_storage(exp.experiment_id, COLUMNS).items())
                page.call("Page.enable")
                page.call("Page.addScriptToEvaluateOnNewDocument", source=setup)  # before the app reads it
                page.call("Page.navigate", url=url)
                deadline = time.time() + args.wait_s
                while rendered not in page.text():
                    if time.time() > deadline:
                        raise SystemExit(f"the page {url} did not render in {args.wait_s:g} s")
                    time.sleep(0.5)
                # the navigation sidebar folded away: its width goes to the table's columns
                page.call("Runtime.evaluate", expression="document.querySelector("
                          "'button[aria-label=\"Toggle sidebar\"]')?.click()")
                time.sleep(2)  # the metric and param cells fill in after the rows
                png = page.call("Page.captureScreenshot", format="png")["data"]
            finally:
                page.close()
        Path(args.out).write_bytes(base64.b64decode(png))
        print(f"screenshot of {url} written to {args.out}")
    finally:
        ui.terminate()
        ui.wait(timeout=30)


if __name__ == "__main__":
    main()
