"""The chat page at / in headless Chromium: it must stream an answer and show reasoning apart
from the answer. Chromium comes from the Debian `chromium` package (installed here if missing).
The browser is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: fds 3/4,
NUL-separated JSON), so no extra Python package is needed."""
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

PROBE = """JSON.stringify((() => {
  const t = document.querySelector('.turn.assistant');
  if (!t) return {started: false};
  const r = t.querySelector('.reasoning');
  return {started: true, done: t.dataset.done === '1', finish: t.dataset.finish || '',
          reasoning: r.textContent, reasoning_hidden: r.hidden,
          answer: t.querySelector('.answer').textContent, meta: t.querySelector('.meta').textContent,
          error: (t.querySelector('.error') || {}).textContent || ''};
})())"""


def chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                       check=False, capture_output=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    return shutil.which("chromium")


class Browser:
    def __init__(self, binary):
        import fcntl
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Move the child's ends above 4 so placing them at 3 and 4 cannot clobber each other.
        for name in ("to_browser_r", "from_browser_w"):
            fd = locals()[name]
            high = fcntl.fcntl(fd, fcntl.F_DUPFD, 100)
            os.close(fd)
            if name == "to_browser_r":
                to_browser_r = high
            else:
                from_browser_w = high

        def wire_fds():
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=wire_fds, pass_fds=(3, 4, to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL, stderr=open(os.environ.get("CHROMIUM_LOG", os.devnull), "w"))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self.password = ""
        self.auth_challenges = 0

    def _send(self, method, params=None, session=None):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def call(self, method, params=None, session=None, timeout=30):
        want = self._send(method, params, session)
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == want:
                    assert "error" not in reply, reply
                    return reply["result"]
                if "method" in reply:
                    self._on_event(reply)
            chunk = os.read(self._from_browser, 65536)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raise TimeoutError(method)

    # With the Fetch domain on, every request pauses until continued, and a 401 with a Basic
    # challenge asks for credentials: answered like a user typing the key into the login prompt.
    def _on_event(self, event):
        params, session = event.get("params", {}), event.get("sessionId")
        if event["method"] == "Fetch.requestPaused":
            self._send("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
        elif event["method"] == "Fetch.authRequired":
            self.auth_challenges += 1
            answer = {"response": "ProvideCredentials", "username": "user", "password": self.password}
            self._send("Fetch.continueWithAuth",
                       {"requestId": params["requestId"], "authChallengeResponse": answer}, session)

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_page(page_url, password, timeout=120):
    """Loads the page as a browser user would: the server's Basic challenge is answered with
    `password` (the API key). Returns the probe's final state and the number of challenges."""
    binary = chromium()
    if not binary:
        pytest.skip("chromium is not available")
    browser = Browser(binary)
    browser.password = password
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        browser.call("Fetch.enable", {"handleAuthRequests": True}, session)
        browser.call("Page.navigate", {"url": page_url}, session)
        deadline = time.time() + timeout
        state = {}
        while time.time() < deadline:
            result = browser.call("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session)
            state = json.loads(result["result"].get("value") or "{}")
            if state.get("done"):
                return state, browser.auth_challenges
            time.sleep(0.3)
        pytest.fail(f"the page never finished: {state}")
    finally:
        browser.close()


def test_page_is_not_open_without_the_key(url):
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{url}/", timeout=10)
    assert denied.value.code == 401
    assert denied.value.headers["WWW-Authenticate"].startswith('Basic realm="dsinfer"')
    assert b"<html" not in denied.value.read()


def test_page_streams_reasoning_and_answer(url, key):
    # No key in the page's own field: after the sign-in the browser sends the Basic credentials
    # with the page's API calls, as it does for a person who typed the key into the prompt.
    state, challenges = run_page(f"{url}/?q=Hello&max=24", key)
    assert challenges >= 1
    assert state["error"] == ""
    # Thinking is on: the random-weight model's output starts as reasoning, shown in its own box.
    assert not state["reasoning_hidden"] and state["reasoning"].strip()
    assert state["reasoning"] not in state["answer"] or state["answer"] == ""
    assert "completion tokens" in state["meta"]  # the stream's usage chunk arrived
    assert state["finish"] in ("stop", "length")


def test_page_without_thinking_shows_only_answer(url, key):
    state, _ = run_page(f"{url}/?q=Hello&max=12&thinking=0#key={key}", key)
    assert state["error"] == ""
    assert state["reasoning_hidden"] and state["reasoning"] == ""
    assert state["finish"] in ("stop", "length")


def test_page_reports_auth_errors(url, key):
    # Signed in for the page, but a wrong key typed into the page's field wins for its API calls.
    state, _ = run_page(f"{url}/?q=Hello&max=4#key=wrong-key", key)
    assert "API key" in state["error"]
