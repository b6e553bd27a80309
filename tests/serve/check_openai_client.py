"""The official openai Python client against examples/serve: chat and completions,
streaming and not, give at temperature 0 exactly the text examples/generate gives."""
import json

import openai

from serve_common import arguments, generate_reference, server

args = arguments()

CHAT = [("What is the capital of France?", 30), ("Write a haiku about the sea.", 40)]
COMPLETE = [("The capital of France is", 12), ("def fibonacci(n):", 24)]

with server(args.build, args.model, "--slots", "2", "--threads", "1") as port:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)

    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"], models

    for question, n in CHAT:
        want = generate_reference(args.build, args.model, question, n, chat=True)
        assert want, f"generate gave an empty reply to {question!r}"
        r = client.chat.completions.create(model="tlm", messages=[{"role": "user", "content": question}],
                                           max_tokens=n, temperature=0)
        got = r.choices[0].message.content
        assert got == want, f"chat {question!r}: server {got!r}, generate {want!r}"
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
        assert r.usage.completion_tokens <= n and r.usage.prompt_tokens > 0, r.usage
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        pieces, finish, usage = [], None, None
        for chunk in client.chat.completions.create(model="tlm", messages=[{"role": "user", "content": question}],
                                                    max_tokens=n, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
                finish = c.finish_reason or finish
        assert "".join(pieces) == want, f"streamed chat {question!r}: {''.join(pieces)!r}, generate {want!r}"
        assert len([p for p in pieces if p]) > 1, "the stream came in one piece"
        assert finish == r.choices[0].finish_reason, (finish, r.choices[0].finish_reason)
        assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage
        print(f"chat ok: {question!r} -> {want!r}")

    for prompt, n in COMPLETE:
        want = generate_reference(args.build, args.model, prompt, n)
        r = client.completions.create(model="tlm", prompt=prompt, max_tokens=n, temperature=0)
        assert r.choices[0].text == want, f"completion {prompt!r}: server {r.choices[0].text!r}, generate {want!r}"
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == n, r
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="tlm", prompt=prompt, max_tokens=n, temperature=0, stream=True) if c.choices)
        assert streamed == want, f"streamed completion {prompt!r}: {streamed!r}, generate {want!r}"
        print(f"completion ok: {prompt!r} -> {want!r}")

    # A stop string: the text ends before it, and it is not returned.
    full = generate_reference(args.build, args.model, "The capital of France is", 12)
    cut = full.index("\n") if "\n" in full else None
    assert cut is not None, f"the reference has no newline to stop at: {full!r}"
    r = client.completions.create(model="tlm", prompt="The capital of France is", max_tokens=12, temperature=0, stop=["\n"])
    assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop", (r.choices[0], full)

    # Seeded sampling repeats itself.
    kw = dict(model="tlm", prompt="Once upon a time", max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text, (a.choices[0].text, b.choices[0].text)

    # logit_bias -100 on the greedy first token makes another token come first.
    r = client.completions.create(model="tlm", prompt="The capital of France is", max_tokens=1, temperature=0,
                                  logit_bias={"7042": -100})
    assert r.choices[0].text != " Paris", r.choices[0].text

    # JSON-schema output: the grammar makes it parse and match the schema.
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "color": {"enum": ["red", "green", "blue"]}},
              "required": ["name", "age", "color"]}
    r = client.chat.completions.create(
        model="tlm", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=80, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    doc = json.loads(r.choices[0].message.content)
    assert list(doc) == ["name", "age", "color"] and isinstance(doc["age"], int) and doc["color"] in ("red", "green", "blue"), doc
    r = client.chat.completions.create(model="tlm", messages=[{"role": "user", "content": "Some JSON please."}],
                                       max_tokens=40, temperature=0, response_format={"type": "json_object"})
    json.loads(r.choices[0].message.content)

    # Errors come back as the client's exceptions with OpenAI's fields.
    try:
        client.chat.completions.create(model="tlm", messages=[{"role": "user", "content": "hi"}], n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == "n" and "n must be 1" in e.body["message"], e.body
    try:
        client.completions.create(model="tlm", prompt="x " * 5000, max_tokens=4)
        raise AssertionError("an over-long prompt was accepted")
    except openai.BadRequestError as e:
        assert e.body["code"] == "context_length_exceeded", e.body
    try:
        client.chat.completions.create(model="tlm", messages=[{"role": "user", "content": "hi"}], temperature="hot")
        raise AssertionError("a string temperature was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "temperature", e.body

# With --api-key the client's key is checked: a wrong one is the client's AuthenticationError.
with server(args.build, args.model, "--slots", "1", "--threads", "1", "--api-key", "k-123") as port:
    wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k-124", max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401 and e.body["code"] == "invalid_api_key", e.body
    right = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k-123", max_retries=0)
    r = right.completions.create(model="tlm", prompt="The capital of France is", max_tokens=2, temperature=0)
    assert r.choices[0].text == " Paris.", r.choices[0].text
print("check_openai_client: all passed")
