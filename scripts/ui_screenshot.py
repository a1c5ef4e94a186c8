"""Open the MLflow UI on a study in headless Chromium and save a screenshot of its runs.

    python scripts/ui_screenshot.py --study gradshare-tiny --out ui.png \
        [--backend-store-uri sqlite:///mlflow.db]

Starts `mlflow ui` on a free loopback port against the study's store, waits for it,
lets Chromium render the experiment page (a JavaScript app) and writes the PNG.
Needs Debian's `chromium` (`apt-get install chromium`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="gradshare-tiny")
    ap.add_argument("--out", default="mlflow-ui.png")
    ap.add_argument("--backend-store-uri", default=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    ap.add_argument("--wait-ms", type=int, default=20000)
    args = ap.parse_args(argv)

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    import mlflow

    from gradshare.train.driver import free_port

    mlflow.set_tracking_uri(args.backend_store_uri)
    exp = mlflow.get_experiment_by_name(args.study)
    if exp is None:
        raise SystemExit(f"no study {args.study!r} in {args.backend_store_uri}")
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", args.backend_store_uri,
                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("mlflow ui did not start")
        url = f"{base}/#/experiments/{exp.experiment_id}/runs"
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                            "--no-first-run", "--disable-background-networking", "--disable-component-update",
                            "--disable-sync", f"--user-data-dir={profile}", "--window-size=1600,1000",
                            f"--virtual-time-budget={args.wait_ms}", f"--screenshot={os.path.abspath(args.out)}",
                            url], check=True, timeout=180, capture_output=True)
        print(f"screenshot of {url} written to {args.out}")
    finally:
        ui.terminate()
        ui.wait(timeout=30)


if __name__ == "__main__":
    main()
