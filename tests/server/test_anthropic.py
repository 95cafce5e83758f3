"""Anthropic SDK (anthropic==2.10.0) against dsinfer serve's Messages API."""
import anthropic
import pytest

MSG = [{"role": "user", "content": "Say hello."}]


def test_messages_non_streaming(claude):
    m = claude.messages.create(model="claude-dsinfer-test", max_tokens=8, messages=MSG)
    assert m.type == "message" and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens > 0
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0
    assert all(b.type in ("thinking", "text") for b in m.content)


def test_messages_thinking_disabled_and_system(claude, model):
    m = claude.messages.create(model=model, max_tokens=4, system="You are terse.", messages=MSG,
                               thinking={"type": "disabled"}, extra_body={"ignore_eos": True})
    assert [b.type for b in m.content] == ["text"]


def test_messages_streaming(claude):
    # ignore_eos: on random weights the first sampled token is a stop token ~1 in 150 times,
    # and an empty answer has no blocks to check.
    with claude.messages.stream(model="claude-dsinfer-fast", max_tokens=6, messages=MSG,
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                extra_body={"ignore_eos": True}) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start"
    assert "content_block_start" in events and "message_stop" in events
    assert final.usage.output_tokens > 0
    thinking = [b for b in final.content if b.type == "thinking"]
    assert thinking and thinking[0].signature  # clients send it back later


def test_messages_tool_history_and_count_tokens(claude, model):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}]
    history = MSG + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need weather.", "signature": "from-another-provider"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    m = claude.messages.create(model=model, max_tokens=4, messages=history, tools=tools)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    n = claude.messages.count_tokens(model=model, messages=history, tools=tools)
    plain = claude.messages.count_tokens(model=model, messages=MSG)
    assert n.input_tokens > plain.input_tokens > 0


def test_messages_errors(url, claude):
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model="claude-dsinfer-test", max_tokens=4, messages=MSG)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="gpt-4o", max_tokens=4, messages=MSG)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="claude-dsinfer-test", max_tokens=4, messages=[{"role": "robot", "content": "x"}])
    assert e.value.body["type"] == "error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="claude-dsinfer-test", max_tokens=4, messages=MSG, stop_sequences=[""])


def test_image_input_is_422(claude, model):
    with pytest.raises(anthropic.UnprocessableEntityError):
        claude.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])


def test_tool_choice_any_and_forced_tool_never_lose_output(claude, model):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    # "any" follows the official converter: the model may call a tool; nothing it writes is lost.
    with claude.messages.stream(model=model, max_tokens=12, messages=MSG, tools=tools,
                                tool_choice={"type": "any"}, thinking={"type": "disabled"},
                                extra_body={"ignore_eos": True}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content and (text or any(b.type == "tool_use" for b in final.content))
    m = claude.messages.create(model=model, max_tokens=12, messages=MSG, tools=tools,
                               tool_choice={"type": "tool", "name": "get_weather"},
                               thinking={"type": "disabled"}, extra_body={"ignore_eos": True})
    assert any((b.type == "text" and b.text) or b.type == "tool_use" for b in m.content)
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        claude.messages.create(model=model, max_tokens=4, messages=MSG, tools=tools,
                               tool_choice={"type": "tool", "name": "get_weather"})


def test_thinking_budget_of_the_wrong_type_is_400(claude, model):
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        claude.messages.create(model=model, max_tokens=4, messages=MSG,
                               thinking={"type": "enabled", "budget_tokens": "lots"})
