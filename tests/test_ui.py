"""`compose ui` (issue 26) on both stores: HTTP-level checks of the pages, the answer
form (CSRF, same origin, first-write-wins), escaping, the token and the loopback rule;
and the UI driven in a real headless Chromium (Selenium): open the runs page, open a
paused run, click Approve, see a worker in another process complete it; an XSS probe;
a token refusal. The browser test skips without chromium/chromedriver/selenium, except
under CI where that is a failure."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from urllib.parse import urlencode

import pytest

from composeai import _engine, agent, approve, flow, task
from composeai.cli import main
from composeai.errors import ComposeError
from composeai.testing import FakeModel
from composeai.ui.server import make_server

pytestmark = pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)

XSS = "<script>window.__xss = 1</script><img src=x onerror='window.__xss = 2'>"


@contextmanager
def ui_server(**kw):
    server = make_server("127.0.0.1", 0, **kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def request(host, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(host, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode("utf-8")
    finally:
        conn.close()


def _define():
    @task
    def draft(topic: str) -> str:
        return f"draft about {topic} {XSS}"

    @flow
    def publish(topic: str) -> str:
        text = draft(topic)
        if approve("publish", payload={"draft": text, "note": XSS}):
            return "published: " + text
        return "rejected"

    return publish


def _csrf(page: str) -> str:
    return re.search(r"name='csrf-token' content='([^']+)'", page).group(1)


def test_runs_page_pages_through_runs_with_filters_issue26():
    """The runs page reads one keyset page at a time; following `older` visits every
    run once, newest first; status/kind/search filters apply."""
    publish = _define()

    @flow
    def plain(i: int) -> int:
        return i

    ids = [plain.run(i).id for i in range(23)]
    paused = publish.run("zebra").id
    expected = [paused, *reversed(ids)]
    with ui_server() as (_, host):
        seen, path = [], "/?limit=10"
        while path:
            status, _, page = request(host, "GET", path)
            assert status == 200
            seen += re.findall(r"<tr class='run' data-run-id='([0-9A-Z]+)'>", page)
            older = re.search(r"<a class='older' href='([^']+)'", page)
            path = older.group(1).replace("&amp;", "&") if older else None
        assert seen == expected
        status, _, page = request(host, "GET", "/?status=paused")
        assert re.findall(r"data-run-id='([0-9A-Z]+)'", page) == [paused]
        status, _, page = request(host, "GET", "/?kind=graph")
        assert "no runs found" in page
        status, _, page = request(host, "GET", "/?" + urlencode({"q": "zebra"}))
        assert status == 200
        assert re.findall(r"<tr class='run' data-run-id='([0-9A-Z]+)'>", page) == [paused]
        status, _, page = request(host, "GET", "/?status=bogus")
        assert status == 400 and "unknown status" in page


def test_run_page_escapes_stored_values_and_answers_once_issue26():
    """Stored `<script>` is shown as text (and a CSP forbids inline script); the answer
    form needs the server's CSRF token from a same-origin page; a second answer is
    refused visibly (409), the first one stands."""
    publish = _define()
    run = publish.run("cats")
    with ui_server() as (_, host):
        status, headers, page = request(host, "GET", f"/run/{run.id}")
        assert status == 200
        assert "<script>window" not in page and "onerror='window" not in page
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert "publish" in page and "Approve" in page
        csrf = _csrf(page)
        form = {"csrf": csrf, "interrupt_id": "publish", "action": "approve"}
        post = {"Content-Type": "application/x-www-form-urlencoded", "Origin": f"http://{host}"}
        path = f"/run/{run.id}/answer"

        bad = dict(form, csrf="x" * len(csrf))
        assert request(host, "POST", path, urlencode(bad), post)[0] == 403
        evil = dict(post, Origin="http://evil.example")
        assert request(host, "POST", path, urlencode(form), evil)[0] == 403
        assert [p[0] for p in _engine.get_store().pending(run.id)] == ["publish"]

        status, headers, _ = request(host, "POST", path, urlencode(form), post)
        assert status == 303
        assert headers["Location"] == f"/run/{run.id}?answered=publish"
        status, _, page = request(host, "POST", path, urlencode(dict(form, action="deny")), post)
        assert status == 409
        assert "already answered (first write wins)" in page
        journal = dict(_engine.get_store().journal(run.id))
        assert json.loads(journal["__interrupt__:publish"]) is True

        status, _, page = request(host, "GET", f"/api/run/{run.id}/state")
        assert json.loads(page)["status"] == "paused"
        assert request(host, "GET", "/run/01NOSUCHRUN0000000000000000")[0] == 404


def test_json_answer_form_and_other_pages_issue26():
    """The JSON form answers a question; the costs chart, threads and queues pages render."""

    @agent(model=FakeModel(["a short answer"]))
    def helper(q: str) -> str:
        return q

    @flow
    def asks() -> str:
        from composeai import ask_human

        helper("why?")
        return "got " + json.dumps(ask_human("color", "Which color?"))

    run = asks.run()
    with ui_server() as (_, host):
        _, _, page = request(host, "GET", f"/run/{run.id}")
        form = {"csrf": _csrf(page), "interrupt_id": "color", "action": "json", "value": "{bad"}
        post = {"Content-Type": "application/x-www-form-urlencoded"}
        path = f"/run/{run.id}/answer"
        status, _, page = request(host, "POST", path, urlencode(form), post)
        assert status == 400 and "not valid JSON" in page
        form["value"] = '{"hue": "teal"}'
        assert request(host, "POST", path, urlencode(form), post)[0] == 303
        journal = dict(_engine.get_store().journal(run.id))
        assert json.loads(journal["__interrupt__:color"]) == {"hue": "teal"}

        status, _, page = request(host, "GET", "/costs?by=model")
        assert status == 200 and "<svg class='chart'" in page and "calls" in page
        assert request(host, "GET", "/costs?by=day")[0] == 200
        assert request(host, "GET", "/threads")[0] == 200
        assert request(host, "GET", "/queues")[0] == 200


def _thread_review_graph():
    from composeai.graph import END, Graph, suspend

    def review(state, ctx):
        if ctx.resume is None:
            return suspend({"question": f"Send draft {len(state.get('verdicts', []))}?"})
        return {"verdicts": [*state.get("verdicts", []), ctx.resume]}

    wf = Graph(name="ui_thread_review")
    wf.add_node("review", review)
    wf.start("review").route(
        "review",
        lambda s: "again" if len(s["verdicts"]) < 2 else "done",
        {"again": "review", "done": END},
    )
    return wf.compile()


def test_approve_on_a_thread_bound_graph_run_and_a_stale_page_issue26():
    """Issue 26: Approve on a graph run kept in a thread journals the answer and makes
    the run due; the worker's pass continues it in its thread. A page showing a
    suspension the run has since moved on from cannot answer the node's next question:
    the post is refused visibly (409) and nothing is stored."""
    import composeai as compose

    thread = _thread_review_graph().thread("ui-thread")
    paused = thread.run({})
    assert paused.suspended
    run_id = paused.run_id
    post = {"Content-Type": "application/x-www-form-urlencoded"}
    path = f"/run/{run_id}/answer"
    with ui_server() as (_, host):
        _, _, first_page = request(host, "GET", f"/run/{run_id}")
        assert "Send draft 0?" in first_page and "Approve" in first_page
        at = re.search(r"name='at' value='([^']+)'", first_page).group(1)
        assert at == thread.history(1)[0]["id"]
        form = {"csrf": _csrf(first_page), "interrupt_id": "node:review", "action": "approve"}
        form["at"] = at
        status, headers, _ = request(host, "POST", path, urlencode(form), post)
        assert status == 303
        assert headers["Location"] == f"/run/{run_id}?answered=node%3Areview"
        [moved] = compose.wake_due()
        assert (moved.id, moved.status) == (run_id, "paused")
        assert thread.state() == {"verdicts": [True]}

        # The first page again: its answer belongs to a suspension that is gone.
        status, _, page = request(host, "POST", path, urlencode(dict(form, action="deny")), post)
        assert status == 409
        assert f"interrupt &#x27;node:review&#x27; of run &#x27;{run_id}&#x27;" in page
        assert "moved on since" in page and "nothing was stored" in page
        assert [p[0] for p in _engine.get_store().pending(run_id)] == ["node:review"]
        assert compose.wake_due() == []

        _, _, page = request(host, "GET", f"/run/{run_id}")
        assert "Send draft 1?" in page
        form["at"] = re.search(r"name='at' value='([^']+)'", page).group(1)
        assert request(host, "POST", path, urlencode(form), post)[0] == 303
    [done] = compose.wake_due()
    assert (done.id, done.status) == (run_id, "completed")
    assert thread.state() == {"verdicts": [True, True]}


def test_token_host_and_loopback_rules_issue26(monkeypatch, capsys):
    """A non-loopback host needs --allow-remote and a token; with a token every request
    must carry it; a foreign Host header is refused (DNS rebinding)."""
    with pytest.raises(ComposeError, match="refusing to serve on non-loopback host"):
        make_server("0.0.0.0", 0)
    assert main(["ui", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "pass --allow-remote and set COMPOSE_UI_TOKEN" in capsys.readouterr().err
    monkeypatch.delenv("COMPOSE_UI_TOKEN", raising=False)
    with pytest.raises(ComposeError, match="needs COMPOSE_UI_TOKEN"):
        make_server("0.0.0.0", 0, allow_remote=True)
    with ui_server() as (_, host):
        assert request(host, "GET", "/", headers={"Host": "evil.example"})[0] == 403
    token = "s3cret-token-0123456789"
    monkeypatch.setenv("COMPOSE_UI_TOKEN", token)
    with ui_server() as (_, host):
        status, _, body = request(host, "GET", "/")
        assert status == 401 and "COMPOSE_UI_TOKEN" in body
        assert request(host, "GET", "/", headers={"Authorization": "Bearer nope"})[0] == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert request(host, "GET", "/", headers=auth)[0] == 200
        status, headers, _ = request(host, "GET", f"/?token={token}&status=paused")
        assert status == 303 and headers["Location"] == "/?status=paused"
        assert "HttpOnly" in headers["Set-Cookie"]
        cookie = headers["Set-Cookie"].split(";")[0]
        assert request(host, "GET", "/", headers={"Cookie": cookie})[0] == 200


# -- the browser ---------------------------------------------------------------


def _require(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (required under CI)")
    pytest.skip(what)


def chromium_driver():
    """A headless Chromium through Selenium and Debian's chromedriver."""
    try:
        from selenium import webdriver
    except ImportError:
        _require("selenium is not installed: pip install selenium")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        _require("chromium and chromedriver are not installed: apt-get install chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,900")
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver))


FLOWS = f"""\
from composeai import approve, flow, task

XSS = {XSS!r}


@task
def draft(topic: str) -> str:
    return f"draft about {{topic}} {{XSS}}"


@flow
def release(topic: str) -> str:
    text = draft(topic)
    if approve("ship", payload={{"draft": text, "note": XSS}}):
        return "released: " + text
    return "held"
"""


def test_browser_approve_continues_in_a_worker_xss_and_token_issue26(tmp_path, monkeypatch):
    """In headless Chromium: the runs page lists the paused run; its page shows the
    interrupt; Approve makes a `compose worker` in another process complete it, and the
    page updates to `completed` by itself. Stored markup never runs; without the token the
    server refuses the browser."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver()
    (tmp_path / "ui_flows.py").write_text(FLOWS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import ui_flows

    worker = None
    try:
        run = ui_flows.release.run("moons")
        assert run.status == "paused"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
        worker = subprocess.Popen(
            [sys.executable, "-m", "composeai.cli", "worker", "--import", "ui_flows"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        with ui_server() as (_, host):
            driver.get(f"http://{host}/")
            link = driver.find_element(By.LINK_TEXT, run.id)
            row = driver.find_element(By.CSS_SELECTOR, f"tr[data-run-id='{run.id}']")
            assert "paused" in row.text
            link.click()
            # The page reloads itself when the run moves on: elements may go stale.
            reloading = (StaleElementReferenceException, NoSuchElementException)
            wait = WebDriverWait(driver, 90, 0.2, ignored_exceptions=reloading)
            wait.until(lambda d: d.find_element(By.ID, "run-status").text == "paused")
            payload = driver.find_element(By.CSS_SELECTOR, ".interrupt pre.payload").text
            assert "<script>window.__xss = 1</script>" in payload
            assert driver.execute_script("return window.__xss") is None

            driver.find_element(By.CSS_SELECTOR, "button.approve").click()

            def completed_output(d):
                if d.find_element(By.ID, "run-status").text != "completed":
                    return None
                return d.find_element(By.CSS_SELECTOR, "pre.run-output").text

            output = wait.until(completed_output)
            assert "released: draft about moons <script>" in output
            assert driver.execute_script("return window.__xss") is None
            assert not driver.find_elements(By.CSS_SELECTOR, "button.approve")

        monkeypatch.setenv("COMPOSE_UI_TOKEN", "browser-token-0123456789")
        with ui_server() as (_, host):
            driver.get(f"http://{host}/")
            assert "401" in driver.find_element(By.TAG_NAME, "body").text
            assert not driver.find_elements(By.LINK_TEXT, run.id)
            driver.get(f"http://{host}/?token=browser-token-0123456789")
            assert driver.find_element(By.LINK_TEXT, run.id)
    finally:
        driver.quit()
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        sys.modules.pop("ui_flows", None)
    row = _engine.get_store().get_run(run.id)
    assert row["status"] == "completed"


def test_screenshot_script_writes_pngs_issue26(tmp_path):
    """docs/screenshots.py renders the runs page and a run page to PNG files."""
    chromium_driver().quit()
    script = os.path.join(os.path.dirname(__file__), "..", "docs", "screenshots.py")
    subprocess.run(
        [sys.executable, script, "--out", str(tmp_path)], check=True, timeout=300, env=os.environ
    )
    for name in ("ui-runs.png", "ui-inbox.png", "ui-run.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# -- issue 36: inbox, timeline, actions, workers, error pages --------------------


POST = {"Content-Type": "application/x-www-form-urlencoded"}


def _steps_flow():
    from composeai.messages import Usage

    usage = Usage(input_tokens=400, output_tokens=100, cost_usd=0.0025, cost_complete=True)

    @agent(model=FakeModel(["a summary"] * 4, usage=usage))
    def summarize(text: str) -> str:
        return f"Summarize: {text}"

    @task
    def fetch(url: str) -> str:
        return f"page at {url}"

    @flow
    def digest(url: str) -> str:
        summary = summarize(fetch(url))
        if approve("ship", payload={"summary": summary}):
            return "shipped " + summary
        return "held"

    return digest


def test_inbox_lists_runs_waiting_for_a_person_and_answers_from_the_list_issue36():
    """The inbox lists paused runs with a question or approval pending (not a run parked
    on a timer, not a finished one), each with its answer forms; an answer posted from the
    list (CSRF-checked like every form) returns to the inbox, where the run is gone."""
    import composeai as compose

    publish = _define()
    first, second = publish.run("owls").id, publish.run("bees").id

    @flow
    def later() -> int:
        compose.sleep(3600)
        return 1

    parked = later.run().id
    done = _steps_flow()
    with ui_server() as (_, host):
        status, _, page = request(host, "GET", "/inbox")
        assert status == 200
        listed = re.findall(r"<article class='inbox-item' data-run-id='([0-9A-Z]+)'>", page)
        assert listed == [first, second]
        assert parked not in page
        assert "2 runs waiting for a person" in page
        assert (
            "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page and "<script>window" not in page
        )
        form = {
            "csrf": _csrf(page),
            "interrupt_id": "publish",
            "action": "approve",
            "next": "inbox",
        }
        path = f"/run/{second}/answer"
        assert request(host, "POST", path, urlencode(dict(form, csrf="nope")), POST)[0] == 403
        status, headers, _ = request(host, "POST", path, urlencode(form), POST)
        assert status == 303
        assert headers["Location"] == f"/inbox?answered=publish&run={second}"
        _, _, page = request(host, "GET", headers["Location"])
        assert f"answer to &#x27;publish&#x27; of run {second} stored" in page
        assert re.findall(r"data-run-id='([0-9A-Z]+)'>", page) == [first]
        assert json.loads(dict(_engine.get_store().journal(second))["__interrupt__:publish"])
        del done


def test_run_page_timeline_actions_and_hidden_internal_keys_issue36():
    """The run page draws the spans as a timeline: one row per span with its duration, and
    the tokens and cost of its model calls (the flow's row sums its descendants'); a
    paused run's duration runs on; internal journal entries are not listed. Replay check
    reports no divergence; Fork at this step starts a new run that knows its origin;
    Cancel stops a paused run. Unknown pages and runs get styled 404 pages."""
    digest = _steps_flow()
    run = digest.run("example.org")
    assert run.status == "paused"
    with ui_server() as (_, host):
        status, _, page = request(host, "GET", f"/run/{run.id}")
        assert status == 200 and "<div class='waterfall'" in page
        rows = re.findall(
            r"<details class='wf-span status-(\w+)' data-span-id='[^']+' "
            r"data-parent='[^']*' data-depth='(\d)'",
            page,
        )
        assert [depth for _, depth in rows][:2] == ["0", "1"]
        assert ("paused", "0") in rows
        assert "$0.0025" in page and ">500<" in page
        assert "so far" in page
        keys = re.findall(r"data-step-key='([^']+)'", page)
        assert "fetch#1" in keys
        journal = re.search(r"<ul class='journal'>(.*?)</ul>", page).group(1)
        assert "__interrupt__" not in journal and "fetch#1" in journal
        csrf = _csrf(page)
        assert "Cancel run" in page and "Replay check" in page and "Fork at this step" in page

        base = f"/run/{run.id}"
        status, _, page = request(host, "POST", base + "/replay", urlencode({"csrf": csrf}), POST)
        assert status == 200 and "replay check: ok -- " in page

        assert request(host, "POST", base + "/fork", urlencode({"at": "fetch#1"}), POST)[0] == 403
        form = urlencode({"csrf": csrf, "at": "fetch#1"})
        status, headers, _ = request(host, "POST", base + "/fork", form, POST)
        assert status == 303
        forked = headers["Location"].split("/run/")[1].split("?")[0]
        assert forked != run.id
        _, _, page = request(host, "GET", headers["Location"])
        assert f"forked from run {run.id}" in page
        assert f"<a href='/run/{run.id}'><code>{run.id}</code></a> at <code>fetch#1</code>" in page
        assert "__fork__" not in page
        assert _engine.get_store().get_run(forked)["status"] == "paused"

        status, headers, _ = request(
            host, "POST", base + "/cancel", urlencode({"csrf": csrf}), POST
        )
        assert (status, headers["Location"]) == (303, f"{base}?cancel=cancelled")
        assert _engine.get_store().get_run(run.id)["status"] == "cancelled"
        _, _, page = request(host, "GET", headers["Location"])
        assert "run cancelled" in page and "Cancel run" not in page

        status, headers, page = request(host, "GET", "/run/01NOSUCHRUN0000000000000000")
        assert status == 404 and "<p class='code'>404</p>" in page
        assert "stylesheet" in page and "csrf-token" in page
        status, _, page = request(host, "GET", "/no/such/page")
        assert status == 404 and "there is no page at /no/such/page" in page
        assert request(host, "POST", f"{base}/explode", urlencode({"csrf": csrf}), POST)[0] == 404


def test_workers_page_shows_lease_holders_issue36():
    """A process executing a run holds its lease: the workers page shows it alive, with
    its host, pid, last heartbeat and the runs it holds; error pages served before the
    token check carry no CSRF token."""
    started, release = threading.Event(), threading.Event()

    @task
    def wait_here() -> int:
        started.set()
        release.wait(60)
        return 1

    @flow
    def holder() -> int:
        return wait_here()

    with ui_server() as (_, host):
        status, _, page = request(host, "GET", "/workers")
        assert status == 200 and "no process holds a lease right now" in page
        worker = threading.Thread(target=holder.run)
        worker.start()
        try:
            assert started.wait(60)
            _, _, page = request(host, "GET", "/workers")
            row = re.search(r"<tr class='worker alive'>(.*?)</tr>", page).group(1)
            assert f"<td>{os.getpid()}</td>" in row and ">alive<" in row
            assert "ago</td><td class='num'>1</td>" in row
        finally:
            release.set()
            worker.join(60)
        status, _, page = request(host, "GET", "/", headers={"Host": "evil.example"})
        assert status == 403 and "unexpected Host header" in page and "csrf-token" not in page


def test_browser_inbox_approve_fork_from_a_span_and_cancel_issue36(
    tmp_path, monkeypatch, store_kind
):
    """In headless Chromium: the inbox lists the paused run; Approve there makes a `compose
    worker` in another process complete it; on the completed run's timeline, opening a
    step's span and clicking Fork at this step starts a new run (paused at the approval
    again); Cancel on that run's page (confirmed) cancels it."""
    if store_kind == "postgresql":
        pytest.skip("the HTTP-level tests cover both stores; one browser pass is enough")
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver()
    (tmp_path / "ui_flows36.py").write_text(FLOWS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import ui_flows36

    worker = None
    try:
        run = ui_flows36.release.run("comets")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
        worker = subprocess.Popen(
            [sys.executable, "-m", "composeai.cli", "worker", "--import", "ui_flows36"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        reloading = (StaleElementReferenceException, NoSuchElementException)
        wait = WebDriverWait(driver, 90, 0.2, ignored_exceptions=reloading)
        with ui_server() as (_, host):
            driver.get(f"http://{host}/inbox")
            item = driver.find_element(By.CSS_SELECTOR, f"article[data-run-id='{run.id}']")
            assert "<script>window.__xss = 1</script>" in item.text
            item.find_element(By.CSS_SELECTOR, "button.approve").click()
            wait.until(lambda d: "stored" in d.find_element(By.CSS_SELECTOR, ".flash.ok").text)
            assert not driver.find_elements(By.CSS_SELECTOR, f"article[data-run-id='{run.id}']")

            driver.get(f"http://{host}/run/{run.id}")
            wait.until(lambda d: d.find_element(By.ID, "run-status").text == "completed")
            span = driver.find_element(By.CSS_SELECTOR, "details.wf-span[data-step-key='draft#1']")
            span.find_element(By.TAG_NAME, "summary").click()
            span.find_element(By.CSS_SELECTOR, "button.fork").click()
            wait.until(lambda d: "forked from run" in d.find_element(By.TAG_NAME, "main").text)
            forked = driver.current_url.split("/run/")[1].split("?")[0]
            assert forked != run.id
            wait.until(lambda d: d.find_element(By.ID, "run-status").text == "paused")
            assert driver.execute_script("return window.__xss") is None

            driver.find_element(By.CSS_SELECTOR, "button.cancel").click()
            driver.switch_to.alert.accept()
            wait.until(lambda d: d.find_element(By.ID, "run-status").text == "cancelled")
    finally:
        driver.quit()
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        sys.modules.pop("ui_flows36", None)
    assert _engine.get_store().get_run(run.id)["status"] == "completed"
    assert _engine.get_store().get_run(forked)["status"] == "cancelled"
