"""OpenAI SDK (openai==3.51.0) against dsinfer serve: chat, completions, responses, errors."""
import re

from conftest import http
import openai
import pytest

USER = [{"role": "user", "content": "Say hello."}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_models_list(oai, model):
    ids = [m.id for m in oai.models.list().data]
    assert ids == [model]


def test_chat_non_streaming_usage_and_reasoning(oai, model):
    r = oai.chat.completions.create(model=model, messages=USER, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.role == "assistant"
    # Thinking is on by default (DeepSeek API): reasoning_content is always present as a field.
    assert "reasoning_content" in choice.message.model_extra
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens is not None
    extra = u.model_extra
    assert extra["prompt_cache_hit_tokens"] + extra["prompt_cache_miss_tokens"] == u.prompt_tokens


def test_prefix_cache_hit_reported_on_repeat(oai, model):
    long_user = [{"role": "user", "content": "word " * 300}]
    oai.chat.completions.create(model=model, messages=long_user, max_tokens=1)
    r = oai.chat.completions.create(model=model, messages=long_user, max_tokens=1)
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    assert r.usage.model_extra["prompt_cache_hit_tokens"] == r.usage.prompt_tokens_details.cached_tokens


def test_chat_streaming_include_usage(oai, model):
    chunks = list(oai.chat.completions.create(model=model, messages=USER, max_tokens=6, stream=True,
                                              stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    assert first.model_extra.get("reasoning_content") == ""
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1


def test_thinking_disabled_has_no_reasoning(oai, model):
    r = oai.chat.completions.create(model=model, messages=USER, max_tokens=4,
                                    extra_body={"thinking": {"type": "disabled"}})
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    s = list(oai.chat.completions.create(model=model, messages=USER, max_tokens=4, stream=True,
                                         reasoning_effort="none"))
    assert "reasoning_content" not in (s[0].choices[0].delta.model_extra or {})


def test_tools_and_tool_history_accepted(oai, model):
    messages = USER + [
        {"role": "assistant", "content": "", "reasoning_content": "Need weather.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = oai.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with_tools = oai.chat.completions.create(model=model, messages=USER, tools=TOOLS, max_tokens=1)
    without = oai.chat.completions.create(model=model, messages=USER, max_tokens=1)
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 50  # the tools prompt


def test_logprobs_n_and_seed(oai, model):
    r = oai.chat.completions.create(model=model, messages=USER, max_tokens=3, logprobs=True, top_logprobs=2,
                                    extra_body={"thinking": {"type": "disabled"}, "ignore_eos": True})
    entries = r.choices[0].logprobs.content
    assert len(entries) >= 1
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
    r2 = oai.chat.completions.create(model=model, messages=USER, max_tokens=3, n=2)
    assert [c.index for c in r2.choices] == [0, 1]
    a = oai.chat.completions.create(model=model, messages=USER, max_tokens=6, seed=7, temperature=1.0)
    b = oai.chat.completions.create(model=model, messages=USER, max_tokens=6, seed=7, temperature=1.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.model_extra["reasoning_content"] == b.choices[0].message.model_extra["reasoning_content"]


def test_max_tokens_length_finish(oai, model):
    r = oai.chat.completions.create(model=model, messages=USER, max_tokens=2,
                                    extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 2


def test_completions(oai, model):
    r = oai.completions.create(model=model, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    echoed = oai.completions.create(model=model, prompt="Hello", max_tokens=1, echo=True)
    assert echoed.choices[0].text.startswith("Hello")
    scored = oai.completions.create(model=model, prompt="Hello", max_tokens=1, logprobs=1,
                                    extra_body={"ignore_eos": True})
    assert len(scored.choices[0].logprobs.tokens) == 1 and scored.choices[0].logprobs.text_offset == [0]
    # Scoring the prompt (echo + logprobs, lm-eval's loglikelihood): the prompt's tokens come back
    # with their logprobs (none for the first, which nothing predicts) and nothing is generated.
    prompt = oai.completions.create(model=model, prompt="Hello world, hello", max_tokens=0,
                                    echo=True, logprobs=1)
    lp = prompt.choices[0].logprobs
    assert prompt.choices[0].text == "Hello world, hello" and prompt.usage.completion_tokens == 0
    assert len(lp.tokens) == len(lp.token_logprobs) == prompt.usage.prompt_tokens >= 3
    assert lp.token_logprobs[0] is None
    assert all(x is not None and -1e4 < x <= 0 for x in lp.token_logprobs[1:])
    assert len(set(lp.token_logprobs[1:])) > 1  # scored per token, not a constant
    chunks = list(oai.completions.create(model=model, prompt="Hi", max_tokens=3, stream=True,
                                         extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) is not None
    assert chunks[-1].choices[0].finish_reason == "length"


def test_responses_non_streaming_and_retrieve(oai, model):
    r = oai.responses.create(model=model, input="Hi there", max_output_tokens=6, instructions="Be brief.",
                             extra_body={"ignore_eos": True})  # random weights: EOS first ~1 in 150
    assert r.status in ("completed", "incomplete")
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.output and r.output[0].type in ("reasoning", "message")
    got = oai.responses.retrieve(r.id)
    assert got.id == r.id and got.status == r.status


def test_responses_streaming_events(oai, model):
    events = list(oai.responses.create(model=model, input="Hi", max_output_tokens=6, stream=True,
                                       reasoning={"effort": "high"}, extra_body={"ignore_eos": True}))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[1] == "response.in_progress"
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.output_item.added" in types
    final = events[-1].response
    assert final.usage.output_tokens > 0


def test_responses_tool_round_trip_input_accepted(oai, model):
    r = oai.responses.create(model=model, max_output_tokens=2, tools=[{
        "type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
        input=[{"role": "user", "content": "weather?"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])
    assert r.status in ("completed", "incomplete")


def test_errors_map_to_sdk_exceptions(url, model):
    bad_key = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model=model, messages=USER, max_tokens=1)


def test_bad_requests(oai, model):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="no-such-model", messages=USER, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=USER, temperature=5)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=USER, response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=model, messages=USER, max_tokens=100000)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "x " * 5000}])
    assert e.value.code == "context_length_exceeded"


def test_json_object_with_json_word_accepted(oai, model):
    r = oai.chat.completions.create(model=model, max_tokens=4, response_format={"type": "json_object"},
                                    messages=[{"role": "user", "content": "Reply in JSON."}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tokenize_detokenize(url, key):
    t = http("POST", "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}, key).json()
    assert t["count"] == len(t["tokens"]) > 0
    d = http("POST", "/detokenize", {"tokens": t["tokens"]}, key).json()
    assert d["prompt"] == "Hello world"
    chat = http("POST", "/tokenize", {"messages": USER}, key).json()
    assert chat["count"] > t["count"]


def test_health_ready_metrics(url, key):
    assert http("GET", "/health").status_code == 200
    assert http("GET", "/ready").status_code == 200
    assert http("GET", "/metrics").status_code == 401
    m = http("GET", "/metrics", key=key).text
    for name in ("dsinfer:num_requests_running", "dsinfer:num_requests_waiting", "dsinfer:kv_cache_usage_perc",
                 "dsinfer:prefix_cache_queries_total", "dsinfer:prefix_cache_hits_total",
                 "dsinfer:prompt_tokens_total", "dsinfer:generation_tokens_total",
                 "dsinfer:time_to_first_token_seconds_bucket", "dsinfer:inter_token_latency_seconds_bucket",
                 "dsinfer:e2e_request_latency_seconds_count", "dsinfer:request_queue_time_seconds_sum",
                 'dsinfer:request_success_total{finished_reason="length"}', "dsinfer:num_aborted_requests_total"):
        assert name in m, name


def test_chat_page_served(url, key):
    assert http("GET", "/").status_code == 401  # only /health and /ready are open
    r = http("GET", "/", key=key)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "/v1/chat/completions" in r.text and "reasoning" in r.text


def test_responses_cancel_endpoint(url, key, model):
    import json
    import socket
    from urllib.parse import urlparse
    u = urlparse(url)
    body = json.dumps({"model": model, "input": "hi", "stream": True, "max_output_tokens": 1000,
                       "ignore_eos": True}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    s.sendall((f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    data = b""
    while b"response.created" not in data or b'"id":"resp_' not in data:
        data += s.recv(65536)
    start = data.index(b'"id":"resp_') + 6
    rid = data[start:data.index(b'"', start)].decode()
    assert http("GET", "/v1/responses/" + rid, key=key).json()["status"] == "in_progress"
    cancelled = http("POST", f"/v1/responses/{rid}/cancel", key=key)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    s.settimeout(30)
    while b"0\r\n\r\n" not in data[-16:]:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    assert b"response.completed" not in data
    assert http("GET", "/v1/responses/" + rid, key=key).json()["status"] == "cancelled"


def test_unsupported_features_are_422(oai, model):
    with pytest.raises(openai.UnprocessableEntityError):
        oai.completions.create(model=model, prompt="def f(", suffix="return 1", max_tokens=2)
    # A regex output constraint is served (test_structured_outputs.py has the rest).
    r = oai.chat.completions.create(model=model, messages=USER, max_tokens=4,
                                    response_format={"type": "regex", "regex": "a+"},
                                    extra_body={"chat_template_kwargs": {"thinking": False}})
    assert re.fullmatch("a+", r.choices[0].message.content), r
    with pytest.raises(openai.UnprocessableEntityError):
        oai.responses.create(model=model, input="hi", previous_response_id="resp_x")


def test_developer_role_models_retrieve_and_version(oai, model, key):
    r = oai.chat.completions.create(model=model, max_tokens=2,
                                    messages=[{"role": "developer", "content": "Be brief."}] + USER)
    plain = oai.chat.completions.create(model=model, max_tokens=2, messages=USER)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens  # the developer text is in the prompt
    m = oai.models.retrieve(model)
    assert m.id == model and m.model_extra["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-4o")
    assert http("GET", "/version").json()["version"]
    head = http("HEAD", "/metrics", key=key)
    assert head.status_code == 200 and head.text == "" and int(head.headers["content-length"]) > 0


def test_forced_tool_choice_never_loses_output(oai, model):
    # Thinking must be off for a forced call (the official converter refuses it with thinking).
    with pytest.raises(openai.BadRequestError, match="thinking"):
        oai.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="required",
                                    max_tokens=4)
    r = oai.chat.completions.create(model=model, messages=USER, tools=TOOLS, max_tokens=12,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                    extra_body={"thinking": {"type": "disabled"}, "ignore_eos": True})
    msg = r.choices[0].message
    # Random weights write no valid call: whatever they wrote comes back as text (or a call).
    assert msg.tool_calls or msg.content
    assert r.usage.completion_tokens == 12


def test_sdk_stream_helper(oai, model):
    with oai.chat.completions.stream(model=model, messages=USER, max_tokens=6,
                                     extra_body={"ignore_eos": True,
                                                 "thinking": {"type": "disabled"}}) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        # get_final_completion() refuses a length-cut answer; the accumulated snapshot is it.
        final = stream.current_completion_snapshot
    assert "".join(deltas) == final.choices[0].message.content
    assert final.choices[0].finish_reason == "length"
