"""Fixtures for the end-to-end server tests; tests/server/run.sh starts the server and sets
DSINFER_URL / DSINFER_KEY / DSINFER_MODEL."""
import os

import anthropic
import openai
import pytest

URL = os.environ.get("DSINFER_URL", "http://127.0.0.1:8000")
KEY = os.environ.get("DSINFER_KEY", "")
MODEL = os.environ.get("DSINFER_MODEL", "deepseek-v4-flash")


@pytest.fixture(scope="session")
def url():
    return URL


@pytest.fixture(scope="session")
def key():
    return KEY


@pytest.fixture(scope="session")
def model():
    return MODEL


@pytest.fixture(scope="session")
def oai():
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def claude():
    return anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=120)


class Reply:
    def __init__(self, status, headers, body):
        self.status_code, self.headers, self.text = status, headers, body

    def json(self):
        import json
        return json.loads(self.text)


def http(method, path, body=None, key=None, timeout=60):
    """Plain stdlib HTTP client (the SDKs' own transport is not needed for these checks)."""
    import json
    import urllib.error
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode())
    except urllib.error.HTTPError as e:
        return Reply(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode())
