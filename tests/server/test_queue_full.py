"""429 + Retry-After from the real engine (not a fake): a server that runs one sequence and
queues one more refuses the third request, through both SDKs' exception types, and serves
normally again once the queue drains. Starts its own `dsinfer serve` (run.sh passes the binary
and the demo model in DSINFER_BIN / DSINFER_MODEL_DIR)."""
import os
import socket
import subprocess
import threading
import time
import urllib.request

import json

import anthropic
import openai
import pytest

BIN = os.environ.get("DSINFER_BIN", "")
MODEL_DIR = os.environ.get("DSINFER_MODEL_DIR", "")
KEY = "sk-queue-test"


@pytest.fixture(scope="module")
def small_server():
    if not BIN or not MODEL_DIR:
        pytest.skip("DSINFER_BIN / DSINFER_MODEL_DIR not set (run through tests/server/run.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([BIN, "serve", "--model", MODEL_DIR, "--host", "127.0.0.1", "--port", str(port),
                             "--api-key", KEY, "--max-num-seqs", "1", "--max-queue", "1", "--threads", "1",
                             "--shutdown-timeout", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/ready", timeout=1).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, "server died while loading"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def served_model(url):
    """The name the server answers to: the checkpoint's default (deepseek-v4-flash or
    deepseek-v4.1-flash), so the test runs against either demo preset."""
    request = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer " + KEY})
    return json.loads(urllib.request.urlopen(request, timeout=10).read())["data"][0]["id"]


def gauge(url, name):
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer " + KEY})
    for line in urllib.request.urlopen(request, timeout=10).read().decode().splitlines():
        if line.startswith("dsinfer:" + name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no dsinfer:{name} in /metrics")


def test_full_queue_gives_429_with_retry_after(small_server):
    oai = openai.OpenAI(base_url=small_server + "/v1", api_key=KEY, max_retries=0, timeout=120)
    claude = anthropic.Anthropic(base_url=small_server, api_key=KEY, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "hi"}]
    model = served_model(small_server)
    # 1) occupies the only running slot until we close it.
    running = oai.chat.completions.create(model=model, messages=messages, max_tokens=1000, stream=True,
                                          extra_body={"ignore_eos": True})
    next(iter(running))
    # The first chunk (the role) may come before the engine schedules the request.
    deadline = time.time() + 30
    while time.time() < deadline and gauge(small_server, "num_requests_running") < 1:
        time.sleep(0.05)
    assert gauge(small_server, "num_requests_running") == 1
    # 2) waits in the queue (the only queue slot) on a thread.
    queued_result = {}

    def queued():
        try:
            queued_result["reply"] = oai.completions.create(model=model, prompt="x", max_tokens=2)
        except Exception as exc:  # surfaced by the assertion below
            queued_result["error"] = exc

    waiter = threading.Thread(target=queued)
    waiter.start()
    # Only once the engine reports it waiting may the third request go: sent earlier, it would
    # take the queue slot itself and wait behind the 1000-token stream.
    deadline = time.time() + 30
    while time.time() < deadline and gauge(small_server, "num_requests_waiting") < 1:
        time.sleep(0.1)
    assert gauge(small_server, "num_requests_waiting") == 1
    refused = None
    try:
        # 3) no room: must be refused, not queued.
        oai.chat.completions.create(model=model, messages=messages, max_tokens=2)
    except openai.RateLimitError as exc:
        refused = exc
    assert refused is not None, "the third request was never refused"
    assert refused.status_code == 429
    assert int(refused.response.headers["retry-after"]) >= 1
    assert refused.body["code"] == "rate_limit_exceeded" or "queue" in str(refused)
    with pytest.raises(anthropic.RateLimitError):
        claude.messages.create(model="claude-x", max_tokens=2, messages=messages)
    # Free the slot: the queued request completes, and new requests are served again.
    running.close()
    waiter.join(timeout=120)
    assert "error" not in queued_result, queued_result.get("error")
    assert queued_result["reply"].choices[0].text is not None
    again = oai.chat.completions.create(model=model, messages=messages, max_tokens=2)
    assert again.choices[0].finish_reason in ("stop", "length")
