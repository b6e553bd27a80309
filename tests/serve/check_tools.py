"""Tool calls through the official openai client: `tools`, `tool_choice` and
`parallel_tool_calls` as OpenAI defines them. With tool_choice required (or a named
function), 20 seeded samples at temperature 1 are calls whose arguments parse and validate
against the tool's schema, streamed and not; with auto, a reply is words or such calls;
a reply pushed to go on after its first call (a logit_bias on the newline, the separator
between calls) holds several valid calls, in order, streamed alike at their indexes, and
exactly one with parallel_tool_calls false; a conversation with the assistant's call and
the tool's result goes on. The prompt the server renders for tools,
calls and results under --chat-template qwen2.5 is Qwen2.5's own Jinja template's
(models/llama.cpp/templates), token for token: the reply to it at temperature 0 is the
one examples/generate gives for the Jinja rendering's ids. Then the refusals."""
import json
import os
import subprocess
import sys

import jinja2.sandbox
import openai
from jinja2.ext import loopcontrols

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

from serve_common import arguments, request, server  # noqa: E402
from tokenizer_common import build_hf_tokenizer, hf_encode  # noqa: E402

args = arguments()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city today",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer"}},
                   "required": ["city", "unit", "days"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters: arguments {}
TOOLS = [WEATHER, TIME, NOW]
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def valid(name, arguments):
    """The arguments (a JSON string) against the tool's schema: every property, of its type."""
    a = json.loads(arguments)
    assert isinstance(a, dict), arguments
    tool = {t["function"]["name"]: t for t in TOOLS}[name]
    props = tool["function"].get("parameters", {"properties": {}})["properties"]
    assert list(a) == list(props), (name, arguments)
    for key, schema in props.items():
        v = a[key]
        if "enum" in schema:
            assert v in schema["enum"], (key, v)
        elif schema["type"] == "string":
            assert isinstance(v, str), (key, v)
        elif schema["type"] == "integer":
            assert isinstance(v, int) and not isinstance(v, bool), (key, v)
    return a


def streamed_call(client, **kw):
    """A streamed reply's words, its tool calls (deltas joined by index) and finish reason."""
    words, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            words += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
    return words, [calls[i] for i in sorted(calls)], finish


hf, _ = build_hf_tokenizer(args.model)
[NEWLINE] = hf_encode(hf, "\n", parse_special=False)

with server(args.build, args.model, "--parallel", "2", "--threads", "1") as port:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    names = {}
    for seed in range(20):
        r = client.chat.completions.create(model="tlm", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=1, seed=seed, max_tokens=120)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (seed, c)
        assert c.message.content is None and len(c.message.tool_calls) >= 1, c.message
        for call in c.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call"), call
            valid(call.function.name, call.function.arguments)
            names[call.function.name] = names.get(call.function.name, 0) + 1
        words, calls, finish = streamed_call(client, model="tlm", messages=ASK, tools=TOOLS, tool_choice="required",
                                             temperature=1, seed=seed, max_tokens=120)
        assert words == "" and finish == "tool_calls", (words, calls, finish)
        # The same seed, the same calls, streamed or not.
        assert [(x["name"], x["arguments"]) for x in calls] == [
            (x.function.name, x.function.arguments) for x in c.message.tool_calls], (calls, c.message.tool_calls)
    # A named function is the one called.
    for seed in range(5):
        r = client.chat.completions.create(model="tlm", messages=ASK, tools=TOOLS, temperature=1, seed=seed, max_tokens=120,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
        for call in r.choices[0].message.tool_calls:
            assert call.function.name == "get_time", call
            valid("get_time", call.function.arguments)
    # auto: words or a valid call, streamed alike.
    kinds = {"words": 0, "call": 0}
    for seed in range(8):
        r = client.chat.completions.create(model="tlm", messages=ASK, tools=TOOLS, tool_choice="auto", temperature=1,
                                           seed=seed, max_tokens=120)
        c = r.choices[0]
        if c.message.tool_calls:
            kinds["call"] += 1
            assert c.finish_reason == "tool_calls" and c.message.content is None
            for call in c.message.tool_calls:
                valid(call.function.name, call.function.arguments)
        else:
            kinds["words"] += 1
            assert c.finish_reason in ("stop", "length") and c.message.content, c
        words, calls, finish = streamed_call(client, model="tlm", messages=ASK, tools=TOOLS, temperature=1, seed=seed,
                                             max_tokens=120)
        if c.message.tool_calls:
            assert [(x["name"], x["arguments"]) for x in calls] == [
                (x.function.name, x.function.arguments) for x in c.message.tool_calls]
        else:
            assert words == c.message.content and not calls and finish == c.finish_reason, (words, c.message.content)
    # Several calls in one reply: a newline, the separator, favoured wherever the grammar
    # allows one, so the reply goes on after each call while max_tokens has room for
    # another (the budget is max_tokens - 1 characters; the shortest call, now(), is 55).
    # Each is valid, in order, with an id of its own, and the stream gives the same calls
    # at indexes 0, 1, ...; with parallel_tool_calls false the same push gives one call.
    several = dict(model="tlm", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1, max_tokens=300,
                   logit_bias={str(NEWLINE): 100})
    counts = []
    for seed in range(3):
        r = client.chat.completions.create(seed=seed, **several)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None, c
        assert len(c.message.tool_calls) >= 2, c.message.tool_calls
        assert len({x.id for x in c.message.tool_calls}) == len(c.message.tool_calls), c.message.tool_calls
        for call in c.message.tool_calls:
            valid(call.function.name, call.function.arguments)
        counts.append(len(c.message.tool_calls))
        words, calls, finish = streamed_call(client, seed=seed, **several)
        assert words == "" and finish == "tool_calls", (words, finish)
        assert [(x["name"], x["arguments"]) for x in calls] == [
            (x.function.name, x.function.arguments) for x in c.message.tool_calls], (calls, c.message.tool_calls)
        one = client.chat.completions.create(seed=seed, parallel_tool_calls=False, **several)
        assert one.choices[0].finish_reason == "tool_calls" and len(one.choices[0].message.tool_calls) == 1, one
        valid(one.choices[0].message.tool_calls[0].function.name, one.choices[0].message.tool_calls[0].function.arguments)
    # tool_choice none: words, and the tools are not shown to the model.
    r = client.chat.completions.create(model="tlm", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=16)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    plain = client.chat.completions.create(model="tlm", messages=ASK, temperature=0, max_tokens=16)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    # The call and its result go back into the conversation, which goes on in words.
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius","days":3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny, 21 C, 17 C with rain"}]
    r = client.chat.completions.create(model="tlm", messages=history, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=24)
    assert r.choices[0].message.content, r

    # Refusals: each a 400 naming the field and the reason.
    for body, part in [
        ({"tools": [{"type": "retrieval"}]}, "'tools[0]' must be {\"type\": \"function\""),
        ({"tools": [WEATHER, WEATHER]}, "two tools are named 'get_weather'"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "1 to 64 letters, digits"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "format": "date"}}, "required": ["x"]}}}]}, "'tools[0].function.parameters'"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "must be an object schema"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "'tool_choice' is 'sometimes'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
         "names the function 'fly', which 'tools' does not hold"),
        ({"tool_choice": "required"}, "'tools' gives no tools"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "'response_format' and 'tools'"),
        ({"tools": TOOLS, "tool_choice": "required", "max_tokens": 20}, "max_tokens"),
        ({"tools": "all"}, "'tools' must be an array"),
        ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(65)]}, "at most 64"),
        ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "now", "arguments": "{oops"}}]}]},
         "'messages[1].tool_calls[0].function.arguments' is not valid JSON"),
    ]:
        status, got = request(port, "POST", "/v1/chat/completions", {"messages": ASK, **body})
        assert status == 400, (body, status, got)
        assert part in got["error"]["message"], (part, got["error"]["message"])

# Under Qwen2.5's template form the prompt is the Jinja template's, token for token.
template = open(os.path.join(os.path.dirname(args.model), "llama.cpp", "templates", "Qwen-Qwen2.5-7B-Instruct.jinja"),
                encoding="utf-8").read()
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
# Hugging Face's tojson (transformers' chat templates): json.dumps with its default separators.
env.filters["tojson"] = lambda x, **_: json.dumps(x, ensure_ascii=False)
for_jinja = ASK + [
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}},
        {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C and sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
    {"role": "user", "content": "Thanks. And in Rome?"}]
# OpenAI's form: arguments as JSON strings.
for_server = json.loads(json.dumps(for_jinja))
for m in for_server:
    for c in m.get("tool_calls", []):
        c["function"]["arguments"] = json.dumps(c["function"]["arguments"], separators=(",", ":"))
for system in (None, "You answer briefly."):
    msgs = ([{"role": "system", "content": system}] if system else []) + for_jinja
    text = env.from_string(template).render(messages=msgs, tools=TOOLS, add_generation_prompt=True)
    ids = hf_encode(hf, text, parse_special=True)
    out = subprocess.run([os.path.join(args.build, "examples", "generate"), "--model", args.model, "--threads", "1",
                          "-n", "24", "--token-ids", ",".join(map(str, ids))], check=True, capture_output=True,
                         text=True).stdout
    with server(args.build, args.model, "--threads", "1", "--chat-template", "qwen2.5") as port:
        status, r = request(port, "POST", "/v1/chat/completions",
                            {"messages": ([{"role": "system", "content": system}] if system else []) + for_server,
                             "tools": TOOLS, "temperature": 0, "max_tokens": 24})
        assert status == 200, r
        assert r["usage"]["prompt_tokens"] == len(ids), (r["usage"], len(ids))
        reply = r["choices"][0]["message"]
        if reply.get("tool_calls"):
            print(f"qwen2.5 form: the reply to the Jinja prompt is a call {reply['tool_calls']}")
        else:
            assert out.rstrip("\n").endswith(reply["content"]), (out, reply["content"])

print(f"tool calls: 20/20 required replies of valid calls (streamed alike; tools chosen {names}), 5/5 named, "
      f"auto {kinds}; pushed to go on: {counts} calls in 3 replies, 1 each with parallel_tool_calls false; "
      f"the qwen2.5 form renders tools, calls and results as Qwen2.5's Jinja template does")
