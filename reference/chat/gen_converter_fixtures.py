#!/usr/bin/env python3
"""Generates request -> prompt fixtures through deepseek-recipe's own request converters.

Usage: python reference/chat/gen_converter_fixtures.py [--seed N] [--per-api N] [--out DIR]

Random OpenAI Chat Completions, Anthropic Messages and OpenAI Responses request bodies go through
`ChatCompletionRequest(body).convert(ConversionOptions())` (and `MessagesRequest`,
`ResponsesRequest`), then `DeepseekV4Encoding` / `DeepseekV41Encoding().render_conversation(...)`,
with the model named `DeepSeek-V4-Pro` or `DeepSeek-V4.1-Flash` to pick the encoding. Writes
converter_cases.jsonl: {id, api, version, request (no model), prompt + special byte ranges, or the
converter's error}. tests/server/converter_fixture_test.cc posts every request to the live
service and compares the prompt the engine receives.
"""
import argparse
import copy
import json
import os
import random
import sys

import deepseek_recipe as dr

sys.path.insert(0, os.path.dirname(__file__))
from gen_chat_fixtures import (byte_ranges, rand_arguments, rand_conversation, rand_schema,  # noqa
                               rand_text, rand_tools)

MODELS = {"v4": "DeepSeek-V4-Pro", "v4.1": "DeepSeek-V4.1-Flash"}
ENCODINGS = {"v4": dr.DeepseekV4Encoding(), "v4.1": dr.DeepseekV41Encoding()}
CONVERTERS = {"chat": dr.ChatCompletionRequest, "messages": dr.MessagesRequest,
              "responses": dr.ResponsesRequest}
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def rand_effort_fields(rng, req):
    r = rng.random()
    if r < 0.3:
        req["thinking"] = {"type": rng.choice(["enabled", "disabled"])}
    if rng.random() < 0.5:
        req["reasoning_effort"] = rng.choice(EFFORTS)


def chat_request(rng):
    """rand_conversation's request plus the forms only a converter sees: text-part arrays,
    named tool_choice, images, reasoning on/off/effort levels."""
    req = rand_conversation(rng)
    req.pop("thinking", None)
    req.pop("reasoning_effort", None)
    rand_effort_fields(rng, req)
    if req.get("response_format", {}).get("type") == "regex":
        del req["response_format"]
    for m in req["messages"]:
        if m["role"] in ("user", "system") and rng.random() < 0.15:
            m["content"] = [{"type": "text", "text": rand_text(rng)}
                            for _ in range(rng.randint(1, 3))]
    if req.get("tools") and rng.random() < 0.2:
        req["tool_choice"] = {"type": "function",
                              "function": {"name": req["tools"][0]["function"]["name"]}}
    if rng.random() < 0.03:
        req["messages"].append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]})
    return req


def anthropic_tools(rng):
    tools = []
    for t in rand_tools(rng):
        fn = t["function"]
        tool = {"name": fn["name"], "input_schema": fn.get("parameters", {"type": "object"})}
        if "description" in fn:
            tool["description"] = fn["description"]
        tools.append(tool)
    return tools


def blocks(rng, text_only=True):
    if rng.random() < 0.5:
        return rand_text(rng)
    return [{"type": "text", "text": rand_text(rng)} for _ in range(rng.randint(1, 3))]


def messages_request(rng):
    req = {"max_tokens": rng.choice([1, 64, 1000]), "messages": []}
    tools = anthropic_tools(rng) if rng.random() < 0.45 else []
    if rng.random() < 0.5:
        req["system"] = blocks(rng)
    msgs = req["messages"]
    pending = []
    counter = 0
    for _ in range(rng.randint(0, 5)):
        # user turn (tool results first when calls are pending)
        content = []
        for cid in pending:
            result = {"type": "tool_result", "tool_use_id": cid}
            if rng.random() < 0.8:
                result["content"] = blocks(rng)
            if rng.random() < 0.1:
                result["is_error"] = True
            content.append(result)
        pending = []
        if not content or rng.random() < 0.4:
            content.append({"type": "text", "text": rand_text(rng)})
        if rng.random() < 0.03:
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": "iVBORw0KGgo="}})
        msgs.append({"role": "user", "content": content if rng.random() < 0.8 or len(content) > 1
                     or content[0]["type"] != "text" else content[0]["text"]})
        # assistant turn
        if rng.random() < 0.25:
            break
        acontent = []
        if rng.random() < 0.5:
            acontent.append({"type": "thinking", "thinking": rand_text(rng), "signature": "sig"})
        if rng.random() < 0.8:
            acontent.append({"type": "text", "text": rand_text(rng)})
        if tools and rng.random() < 0.5 or rng.random() < 0.05:
            for _ in range(rng.randint(1, 2)):
                cid = "toolu_%d" % counter
                counter += 1
                name = rng.choice(tools)["name"] if tools else "f"
                try:  # a JSON object (Messages input is one), encodable as UTF-8
                    args = json.loads(rand_arguments(rng))
                    json.dumps(args, ensure_ascii=False).encode("utf-8")
                except (ValueError, UnicodeEncodeError):
                    args = {}
                if not isinstance(args, dict):
                    args = {}
                acontent.append({"type": "tool_use", "id": cid, "name": name, "input": args})
                pending.append(cid)
        msgs.append({"role": "assistant", "content": acontent or rand_text(rng)})
    if pending or not msgs or msgs[-1]["role"] == "assistant" and rng.random() < 0.7:
        content = [{"type": "tool_result", "tool_use_id": cid, "content": rand_text(rng)}
                   for cid in pending]
        content.append({"type": "text", "text": rand_text(rng)})
        msgs.append({"role": "user", "content": content})
    if tools:
        req["tools"] = tools
        r = rng.random()
        if r < 0.2:
            req["tool_choice"] = {"type": "any"}
        elif r < 0.3:
            req["tool_choice"] = {"type": "tool", "name": tools[0]["name"]}
        elif r < 0.4:
            req["tool_choice"] = {"type": "none"}
        elif r < 0.6:
            req["tool_choice"] = {"type": "auto"}
    r = rng.random()
    if r < 0.25:
        req["thinking"] = {"type": "disabled"}
    elif r < 0.5:
        req["thinking"] = {"type": "enabled", "budget_tokens": rng.choice([1024, 4096])}
    elif r < 0.55:
        req["thinking"] = {"type": "adaptive"}
    if rng.random() < 0.3:
        req["output_config"] = {"effort": rng.choice(["low", "medium", "high", "xhigh", "max"])}
    return req


def responses_request(rng):
    req = {}
    tools = rand_tools(rng) if rng.random() < 0.45 else []
    if rng.random() < 0.4:
        req["instructions"] = rand_text(rng)
    if rng.random() < 0.2:
        req["input"] = rand_text(rng)
    else:
        items = []
        counter = 0
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.45:
                role = rng.choice(["user", "user", "user", "system", "developer"])
                content = rand_text(rng) if rng.random() < 0.5 else [
                    {"type": "input_text", "text": rand_text(rng)} for _ in range(rng.randint(1, 2))]
                items.append({"role": role, "content": content} if rng.random() < 0.5 else
                             {"type": "message", "role": role, "content": content})
            elif r < 0.6:
                items.append({"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": rand_text(rng)}]})
            elif r < 0.8:
                items.append({"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": rand_text(rng), "annotations": []}]})
            else:
                n = rng.randint(1, 2)
                for _ in range(n):
                    cid = "call_%d" % counter
                    counter += 1
                    name = rng.choice(tools)["function"]["name"] if tools else "f"
                    items.append({"type": "function_call", "call_id": cid, "name": name,
                                  "arguments": rand_arguments(rng)})
                for k in range(n):
                    items.append({"type": "function_call_output",
                                  "call_id": "call_%d" % (counter - n + k), "output": rand_text(rng)})
        if rng.random() < 0.8:
            items.append({"role": "user", "content": rand_text(rng)})
        req["input"] = items
    if tools:
        req["tools"] = [dict({"type": "function", "name": t["function"]["name"]},
                             **{k: v for k, v in t["function"].items()
                                if k in ("description", "parameters")}) for t in tools]
        r = rng.random()
        if r < 0.15:
            req["tool_choice"] = "required"
        elif r < 0.25:
            req["tool_choice"] = {"type": "function", "name": tools[0]["function"]["name"]}
        elif r < 0.35:
            req["tool_choice"] = "none"
    if rng.random() < 0.5:
        req["reasoning"] = {"effort": rng.choice(EFFORTS)}
    r = rng.random()
    if r < 0.1:
        req["text"] = {"format": {"type": "json_object"}}
    elif r < 0.18:
        req["text"] = {"format": {"type": "json_schema", "name": "s", "schema": rand_schema(rng)}}
    return req


GENERATORS = {"chat": chat_request, "messages": messages_request, "responses": responses_request}


def render(api, version, request):
    body = copy.deepcopy(request)
    body["model"] = MODELS[version]
    try:
        converted = CONVERTERS[api](body).convert(dr.ConversionOptions())
        rendered = ENCODINGS[version].render_conversation(converted.conversation)
        return {"prompt": rendered.prompt,
                "special": byte_ranges(rendered.prompt, rendered.special_ranges)}
    except Exception as err:  # the converter refused it: the server must refuse too, or document why
        return {"error": type(err).__name__ + ": " + str(err)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--per-api", type=int, default=130)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                  "fixtures", "chat"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for api, make in GENERATORS.items():
        for i in range(args.per_api):
            request = make(rng)
            for version in MODELS:
                row = {"id": "%s%04d-%s" % (api[0], i, version), "api": api, "version": version,
                       "request": request}
                row.update(render(api, version, request))
                rows.append(row)
    path = os.path.join(args.out, "converter_cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    manifest["converter_cases"] = {
        "generator": "reference/chat/gen_converter_fixtures.py",
        "command": "python reference/chat/gen_converter_fixtures.py --seed %d --per-api %d"
                   % (args.seed, args.per_api),
        "deepseek_recipe": dr.__version__, "cases": len(rows),
        "per_version": {v: sum(1 for r in rows if r["version"] == v) for v in MODELS},
        "refused_by_converter": sum(1 for r in rows if "error" in r)}
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print("wrote %d cases to %s" % (len(rows), path))


if __name__ == "__main__":
    main()
