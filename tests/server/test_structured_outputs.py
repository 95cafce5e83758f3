"""Structured outputs end to end on the random-weight demo model, with sampling: generated JSON
schemas (nested objects, arrays with minItems/maxItems, enums, patterns, numeric bounds, anyOf,
$ref, required/optional) through every API spelling; every completed output validates with
jsonschema, every cut one says finish_reason "length". Regex / choice / EBNF likewise, the
openai SDK's parse() with a pydantic model, and the 400s of invalid specs."""
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from typing import List, Literal, Optional

import jsonschema
import openai
import pydantic
import pytest

from conftest import KEY, URL, http

N_SCHEMAS = 320
CONCURRENCY = 16
MAX_TOKENS = 96


def post(path, body, timeout=300):
    r = http("POST", path, body, key=KEY, timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    return r.json()


# ---- schema generator --------------------------------------------------------------------------

WORDS = ["red", "green", "blue", "north", "south", "x", "yes", "no", "alpha", "beta"]
PATTERNS = [("^[a-z]{1,4}$", "lower"), ("^[A-Z][0-9]{2}$", "code"), ("^(ab|cd)+$", "pairs"),
            ("^[0-9]{3}-[0-9]{2}$", "serial")]


def leaf(rng):
    kind = rng.choice(["enum", "pattern", "strlen", "integer", "number", "boolean", "null",
                       "const", "int_enum"])
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)[0]}
    if kind == "strlen":
        lo = rng.randint(0, 2)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(1, 4)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        s = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
        if rng.random() < 0.3:
            del s["maximum"]
        return s
    if kind == "number":
        lo = rng.randint(-20, 20)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "null":
        return {"type": "null"}
    if kind == "const":
        return {"const": rng.choice(WORDS)}
    return {"type": "integer", "enum": rng.sample(range(-5, 100), rng.randint(1, 4))}


def node(rng, depth, defs):
    if depth >= 3 or rng.random() < 0.45:
        return leaf(rng)
    kind = rng.choice(["object", "object", "array", "anyOf", "ref"])
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": node(rng, depth + 1, defs), "minItems": lo,
                "maxItems": lo + rng.randint(0, 2)}
    if kind == "anyOf":
        return {"anyOf": [node(rng, depth + 1, defs), node(rng, depth + 1, defs)]}
    if kind == "ref":
        name = "d%d" % len(defs)
        defs[name] = None  # reserved before the recursion names its own
        defs[name] = node(rng, depth + 1, defs)
        return {"$ref": "#/$defs/" + name}
    return obj(rng, depth, defs)


def obj(rng, depth, defs):
    names = rng.sample(["id", "name", "kind", "size", "tags", "when", "where", "flag", "extra"],
                       rng.randint(1, 4))
    props = {n: node(rng, depth + 1, defs) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    s = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        s["required"] = required
    return s


def make_schema(seed):
    rng = random.Random(seed)
    defs = {}
    s = obj(rng, 0, defs) if rng.random() < 0.8 else node(rng, 1, defs)
    if defs:
        s["$defs"] = defs
    return s


def schema_request(seed, schema):
    """One generated schema through one of the API spellings (chat or completions)."""
    spelling = seed % 5
    msgs = [{"role": "user", "content": "Reply in JSON."}]
    chat = {"messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": seed,
            "chat_template_kwargs": {"thinking": False}}
    if spelling == 0:
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "s", "strict": True, "schema": schema}}
    elif spelling == 1:
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "s", "schema": schema}}
    elif spelling == 2:
        chat["structured_outputs"] = {"json": schema}
    elif spelling == 3:
        chat["json_schema"] = json.dumps(schema)  # SGLang: the schema as JSON text
    else:
        return "/v1/completions", {"prompt": "JSON:", "max_tokens": MAX_TOKENS,
                                   "temperature": 1.0, "seed": seed, "guided_json": schema}
    return "/v1/chat/completions", chat


def output_of(path, reply):
    choice = reply["choices"][0]
    text = choice["text"] if path == "/v1/completions" else choice["message"]["content"]
    return text, choice["finish_reason"]


def test_generated_json_schemas_validate():
    schemas = [(seed, make_schema(seed)) for seed in range(N_SCHEMAS)]
    for _, s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)

    def run(item):
        seed, schema = item
        path, body = schema_request(seed, schema)
        return seed, schema, path, post(path, body)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(run, schemas))
    completed = cut = 0
    for seed, schema, path, reply in results:
        text, finish = output_of(path, reply)
        if finish == "stop":
            try:
                value = json.loads(text)
            except ValueError:
                pytest.fail("seed %d: not JSON: %r (schema %s)" % (seed, text, json.dumps(schema)))
            try:
                jsonschema.validate(value, schema)
            except jsonschema.ValidationError as e:
                pytest.fail("seed %d: %s\noutput %r\nschema %s" % (seed, e.message, text,
                                                                    json.dumps(schema)))
            completed += 1
        else:
            assert finish == "length", (seed, finish, text)
            assert reply["usage"]["completion_tokens"] == MAX_TOKENS, (seed, reply["usage"])
            cut += 1
    print("structured outputs: %d of %d schemas completed, %d cut by max_tokens"
          % (completed, len(results), cut))
    # Random weights draw near-uniformly among the allowed tokens: most outputs still complete.
    assert completed >= len(results) // 2, (completed, cut)


def test_n_samples_stream_and_logprobs_follow_the_schema(oai, model):
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                     "maximum": 9},
                                               "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "ab", "strict": True, "schema": schema}}
    r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "json"}],
                                    max_tokens=64, temperature=1.0, seed=7, n=3, logprobs=True,
                                    top_logprobs=2, response_format=fmt,
                                    extra_body={"chat_template_kwargs": {"thinking": False}})
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)
        assert c.logprobs is not None and len(c.logprobs.content) > 0
    stream = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "json"}], max_tokens=64,
        temperature=1.0, seed=8, stream=True, response_format=fmt,
        extra_body={"chat_template_kwargs": {"thinking": False}})
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_thinking_stays_free_and_the_answer_follows_the_schema(oai, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    think_end = post("/tokenize", {"prompt": "</think>"})["tokens"]
    assert len(think_end) == 1, think_end
    for seed in range(4):
        # A bias draws </think> at once: a token the grammar never allows, so the reasoning was
        # free; what follows it is the answer, under the schema.
        r = oai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "json"}], max_tokens=64,
            temperature=1.0, seed=seed, logit_bias={str(think_end[0]): 100},
            response_format={"type": "json_schema",
                             "json_schema": {"name": "ok", "strict": True, "schema": schema}},
            extra_body={"chat_template_kwargs": {"thinking": True}})
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)


def test_regex_choice_and_ebnf():
    def chat(seed, constraint):
        return "/v1/chat/completions", dict(
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 60, "seed": seed,
             "temperature": 1.0, "chat_template_kwargs": {"thinking": False}}, **constraint)

    def completion(seed, constraint):
        return "/v1/completions", dict(
            {"prompt": "answer:", "max_tokens": 60, "seed": seed, "temperature": 1.0}, **constraint)

    tuple_grammar = 'root ::= "(" num ("," num)* ")"\nnum ::= [0-9] [0-9]?'
    kinds = [
        (completion, {"structured_outputs": {"regex": "[a-c]{2,5}-[0-9]{1,3}"}},
         lambda t: re.fullmatch(r"[a-c]{2,5}-[0-9]{1,3}", t)),
        (chat, {"guided_choice": ["alpha", "beta", "gamma delta"]},
         lambda t: t in ("alpha", "beta", "gamma delta")),
        (completion, {"guided_grammar": tuple_grammar},
         lambda t: re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})*\)", t)),
        (chat, {"regex": "(yes|no), [0-9]{2}"},  # SGLang's spelling
         lambda t: re.fullmatch(r"(yes|no), [0-9]{2}", t)),
        (chat, {"ebnf": 'root ::= "go " dir\ndir ::= "left" | "right"'},  # SGLang's spelling
         lambda t: t in ("go left", "go right")),
        (completion, {"guided_regex": "[A-Z]{3}[0-9]?"},
         lambda t: re.fullmatch(r"[A-Z]{3}[0-9]?", t)),
        # xgrammar structural tags: vLLM / SGLang's response_format and vLLM's
        # structured_outputs.structural_tag (JSON text).
        (chat, {"response_format": {"type": "structural_tag", "format": {
            "type": "sequence", "elements": [
                {"type": "const_string", "value": "Answer: "},
                {"type": "json_schema",
                 "json_schema": {"type": "integer", "minimum": 0, "maximum": 99}}]}}},
         lambda t: re.fullmatch(r"Answer: \s?(0|[1-9][0-9]?)\s?", t)),
        (completion, {"structured_outputs": {"structural_tag": json.dumps({
            "type": "structural_tag", "format": {
                "type": "tag", "begin": "<b>", "end": "</b>",
                "content": {"type": "regex", "pattern": "[a-z]{1,4}"}}})}},
         lambda t: re.fullmatch(r"<b>[a-z]{1,4}</b>", t)),
    ]
    cases = []
    for seed in range(24):
        make, constraint, check = kinds[seed % len(kinds)]
        cases.append(make(seed, constraint) + (check,))

    def run(case):
        path, body, check = case
        return path, check, post(path, body)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(run, cases))
    for path, check, reply in results:
        text, finish = output_of(path, reply)
        # Every one of these grammars is short: a random model completes them.
        assert finish == "stop", (path, text, finish)
        assert check(text), (path, text)


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = pydantic.Field(ge=0, le=30)
    vaccinated: bool
    tags: List[Literal["small", "loud", "old"]] = pydantic.Field(max_length=2)
    owner: Optional[Literal["ann", "bob"]]


def test_openai_sdk_parse_with_a_pydantic_model(oai, model):
    parsed = 0
    for seed in range(6):
        try:
            r = oai.chat.completions.parse(
                model=model, messages=[{"role": "user", "content": "Describe a pet."}],
                response_format=Pet, max_tokens=120, temperature=1.0, seed=seed,
                extra_body={"chat_template_kwargs": {"thinking": False}})
        except openai.LengthFinishReasonError:
            continue
        pet = r.choices[0].message.parsed
        assert isinstance(pet, Pet), r
        parsed += 1
    assert parsed >= 3, parsed


def test_invalid_specs_are_400s_naming_the_problem():
    base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "chat_template_kwargs": {"thinking": False}}
    for extra, needle in [({"guided_regex": "(a"}, "regex does not compile"),
                          ({"guided_json": {"type": "array", "maxItems": 10 ** 7}}, "maxItems"),
                          ({"guided_json": {"$ref": "#/$defs/none"}}, "does not compile"),
                          ({"guided_choice": []}, "at least one"),
                          ({"guided_regex": "a", "guided_choice": ["b"]}, "only one"),
                          ({"structured_outputs": {"grammar": "root ::= nope"}}, "grammar"),
                          ({"response_format": {"type": "structural_tag",
                                                "structures": [], "triggers": []}},
                           "structures/triggers form is not supported"),
                          ({"response_format": {"type": "structural_tag",
                                                "format": {"type": "nope"}}},
                           "structural_tag does not compile")]:
        r = http("POST", "/v1/chat/completions", dict(base, **extra), key=KEY)
        assert r.status_code == 400, (extra, r.status_code, r.text)
        assert needle in r.json()["error"]["message"], (extra, r.text)


# ---- forced tool calls --------------------------------------------------------------------------

N_TOOL_SETS = 48
TOOL_MAX_TOKENS = 384


def make_tools(seed):
    """1..3 tools whose parameters are generated object schemas."""
    rng = random.Random(10_000 + seed)
    tools = []
    for i in range(rng.randint(1, 3)):
        defs = {}
        params = obj(rng, 1, defs)
        if defs:
            params["$defs"] = defs
        tools.append({"name": "tool_%d_%d" % (seed, i), "parameters": params})
    return tools


def check_call(seed, name, arguments, schemas):
    assert name in schemas, (seed, name, list(schemas))
    try:
        value = json.loads(arguments)
    except ValueError:
        pytest.fail("seed %d: arguments of %s are not JSON: %r" % (seed, name, arguments))
    try:
        jsonschema.validate(value, schemas[name])
    except jsonschema.ValidationError as e:
        pytest.fail("seed %d: %s\narguments %r\nschema %s" % (seed, e.message, arguments,
                                                               json.dumps(schemas[name])))


def test_forced_tool_calls_parse_and_validate():
    """tool_choice "required" / a named function / parallel_tool_calls false on generated tool
    schemas, sampled: every call parses and its arguments validate; a cut one says "length"."""
    def run(seed):
        tools = make_tools(seed)
        mode = seed % 3
        body = {"messages": [{"role": "user", "content": "Call a tool."}],
                "tools": [{"type": "function", "function": t} for t in tools],
                "max_tokens": TOOL_MAX_TOKENS, "temperature": 1.0, "seed": seed,
                "chat_template_kwargs": {"thinking": False}}
        if mode == 1:
            body["tool_choice"] = {"type": "function", "function": {"name": tools[-1]["name"]}}
        else:
            body["tool_choice"] = "required"
        if mode == 2:
            body["parallel_tool_calls"] = False
        return seed, tools, mode, post("/v1/chat/completions", body)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(run, range(N_TOOL_SETS)))
    completed = cut = calls = 0
    for seed, tools, mode, reply in results:
        choice = reply["choices"][0]
        schemas = {t["name"]: t["parameters"] for t in tools}
        if mode == 1:
            schemas = {tools[-1]["name"]: tools[-1]["parameters"]}
        if choice["finish_reason"] == "length":
            assert reply["usage"]["completion_tokens"] == TOOL_MAX_TOKENS, (seed, reply["usage"])
            cut += 1
            continue
        assert choice["finish_reason"] == "tool_calls", (seed, choice)
        tool_calls = choice["message"].get("tool_calls") or []
        assert tool_calls, (seed, choice)
        assert not choice["message"].get("content"), (seed, choice["message"])
        if mode == 2:
            assert len(tool_calls) == 1, (seed, tool_calls)
        for call in tool_calls:
            check_call(seed, call["function"]["name"], call["function"]["arguments"], schemas)
            calls += 1
        completed += 1
    print("forced tool calls: %d of %d completed (%d calls), %d cut by max_tokens"
          % (completed, len(results), calls, cut))
    # A random-weight model spells the DSML markup in plain tokens as often as not (each
    # "</｜DSML｜parameter>" can take a dozen draws): about half the calls fit max_tokens.
    assert completed >= len(results) // 3, (completed, cut)


def test_forced_tool_call_streams_and_anthropic_any_validates(oai, model):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                               "days": {"type": "integer", "minimum": 1,
                                                        "maximum": 7}},
              "required": ["city", "days"], "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "weather", "parameters": schema}}
    streamed = 0
    for seed in range(6):
        stream = oai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "weather"}], tools=[tool],
            tool_choice="required", parallel_tool_calls=False, max_tokens=256, temperature=1.0,
            seed=seed, stream=True,
            extra_body={"chat_template_kwargs": {"thinking": False}})
        args, names, finish = {}, {}, None
        for chunk in stream:
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or []:
                    args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
                    if d.function.name:
                        names[d.index] = d.function.name
        if finish == "length":
            continue
        assert finish == "tool_calls" and list(args) == [0], (finish, args)
        for i in args:
            check_call(seed, names[i], args[i], {"weather": schema})
        streamed += 1
    print("forced tool call, streamed: %d of 6 completed" % streamed)
    assert streamed >= 2, streamed

    # Anthropic "any": rendered as "auto" (as the official converter does); the grammar makes
    # the output a tool_use.
    used = 0
    for seed in range(10):
        body = {"model": model, "max_tokens": 256, "temperature": 1.0,
                "messages": [{"role": "user", "content": "weather"}],
                "tools": [{"name": "weather", "input_schema": schema}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": seed % 2 == 0},
                "thinking": {"type": "disabled"}}
        r = post("/v1/messages", body)
        if r["stop_reason"] == "max_tokens":
            continue
        assert r["stop_reason"] == "tool_use", r
        blocks = [b for b in r["content"] if b["type"] == "tool_use"]
        assert blocks and all(b["type"] == "tool_use" for b in r["content"]), r
        if seed % 2 == 0:
            assert len(blocks) == 1, r
        for b in blocks:
            check_call(seed, b["name"], json.dumps(b["input"]), {"weather": schema})
        used += 1
    print("Anthropic tool_choice any: %d of 10 completed" % used)
    assert used >= 3, used
