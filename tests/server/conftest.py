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
