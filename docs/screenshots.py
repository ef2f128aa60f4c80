"""Renders screenshots of `compose ui` into docs/ (ui-runs.png, ui-inbox.png, ui-run.png).

Seeds a throwaway SQLite store with a few runs (completed, failed, and two paused on an
approval), serves the UI on a free loopback port, and photographs the runs page, the inbox
and the paused run's page (its timeline, with a model call's span opened) in headless
Chromium (Debian's `chromium` + `chromium-driver`, through
Selenium). The trace's pause glyph needs a font that has it (Debian's `fonts-symbola`).

    python docs/screenshots.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path


def seed() -> str:
    """Runs a few flows; returns the id of the one paused on an approval."""
    import composeai as compose
    from composeai import agent, approve, flow, task
    from composeai.messages import Usage
    from composeai.testing import FakeModel

    usage = Usage(input_tokens=412, output_tokens=168, cost_usd=0.0031, cost_complete=True)

    @agent(model=FakeModel(["A short, friendly summary."] * 12, usage=usage))
    def summarize(text: str) -> str:
        return f"Summarize in one sentence: {text}"

    @task
    def fetch(url: str) -> str:
        return f"<html>contents of {url}</html>"

    @flow
    def digest(url: str) -> str:
        return summarize(fetch(url))

    @flow
    def publish(url: str) -> str:
        summary = summarize(fetch(url))
        if approve("publish", payload={"url": url, "summary": summary}):
            return "published"
        return "held back"

    @flow
    def flaky(n: int) -> int:
        raise ValueError(f"upstream returned 503 for batch {n}")

    for site in ("example.org/news", "example.org/blog", "example.org/docs", "example.org/faq"):
        digest.run(site)
    try:
        flaky.run(7)
    except ValueError:
        pass
    digest.run("example.org/changelog")
    publish.run("example.org/pricing")
    paused = publish.run("example.org/launch")
    assert paused.status == "paused"
    compose.runs.reset_default()
    return paused.id


def chromium():
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,860")
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    state = tempfile.mkdtemp(prefix="compose-ui-shots-")
    os.environ["COMPOSE_DIR"] = os.path.join(state, "state")
    os.environ.pop("COMPOSE_STORE", None)
    os.environ.pop("COMPOSE_UI_TOKEN", None)
    try:
        run_id = seed()
        from selenium.webdriver.common.by import By

        from composeai.ui.server import make_server

        server = make_server("127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        driver = chromium()
        try:
            driver.get(base + "/")
            driver.find_element(By.LINK_TEXT, run_id)
            driver.save_screenshot(str(out / "ui-runs.png"))
            driver.get(base + "/inbox")
            driver.find_element(By.CSS_SELECTOR, f"article[data-run-id='{run_id}']")
            driver.save_screenshot(str(out / "ui-inbox.png"))
            driver.get(f"{base}/run/{run_id}")
            driver.set_window_size(1280, 1300)
            # Open the model call's span so its input, output and usage show.
            for summary in driver.find_elements(By.CSS_SELECTOR, "details.wf-span > summary"):
                if "llm" in summary.text:
                    summary.click()
                    break
            driver.save_screenshot(str(out / "ui-run.png"))
        finally:
            driver.quit()
            server.shutdown()
            server.server_close()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"wrote {', '.join(str(out / n) for n in ('ui-runs.png', 'ui-inbox.png', 'ui-run.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
