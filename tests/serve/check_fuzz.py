"""A bounded random loop of malformed requests (truncated JSON, wrong types, huge
numbers, invalid UTF-8, deep nesting, unknown paths and methods, raw garbage).
Every answer is an HTTP response: 2xx, or 4xx with an OpenAI-style error body, never
5xx; afterwards /health is OK and a normal request answers as before."""
import http.client
import json
import random
import socket
import time

from serve_common import arguments, request, server, wait_until

args = arguments()
rng = random.Random(12)
COUNT = 2000

GOOD_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
GOOD_COMPLETION = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
          "seed", "stop", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty", "repeat_penalty",
          "logit_bias", "response_format", "logprobs", "echo", "suffix", "best_of", "tools", "user"]
ODD_VALUES = [None, True, False, 0, -1, 1, 2, 3.5, -1e308, 1e308, 2 ** 64, 2 ** 63 - 1, -2 ** 63, 99999999999999999999999,
              "", "x", "\u0000", "\ud7ff", "<|im_end|>", [], [1], ["a"], [""], {}, {"a": 1}, [[]], {"type": "json_schema"},
              {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
              {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
              {"49151": 100}, {"49152": 1}, {"-1": 1}, {"1": "x"}, {"1e3": 1}, [{"role": "user"}],
              [{"role": "robot", "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}],
              [{"role": "user", "content": [{"type": "text", "text": "ok"}]}], {"include_usage": "yes"}]


def mutate_body():
    base = dict(rng.choice([GOOD_CHAT, GOOD_COMPLETION]))
    for _ in range(rng.randint(1, 3)):
        base[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    base["max_tokens"] = base.get("max_tokens") if rng.random() < 0.5 else 2
    return json.dumps(base).encode()


def body_bytes():
    kind = rng.randrange(8)
    if kind == 0:  # truncated
        text = json.dumps(rng.choice([GOOD_CHAT, GOOD_COMPLETION])).encode()
        return text[:rng.randrange(len(text))]
    if kind == 1:  # invalid UTF-8 inside a string
        return b'{"prompt": "ab\xff\xfe\xc3", "max_tokens": 2}'
    if kind == 2:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if kind == 3:  # deep nesting
        depth = rng.choice([100, 10000, 200000])
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 4:  # huge numbers in text form
        return b'{"prompt": "x", "max_tokens": 1' + b"0" * rng.randrange(1, 400) + b', "temperature": 1e999}'
    if kind == 5:  # not an object
        return rng.choice([b"[]", b"null", b"42", b'"text"', b"true", b""])
    return mutate_body()


def check(status, body, what):
    assert status < 500, f"{what}: HTTP {status} {body!r}"
    if status >= 400:
        assert isinstance(body, dict) and "error" in body, f"{what}: HTTP {status} without an error body: {body!r}"
        e = body["error"]
        assert set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str) and e["message"], e


def raw_exchange(port, data):
    """Sends raw bytes; any answer is fine as long as the server lives."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass


with server(args.build, args.model, "--slots", "2", "--threads", "1", "--max-tokens", "8", "--max-body", "400000") as port:
    _, before = request(port, "POST", "/v1/completions", GOOD_COMPLETION)
    counts = {}
    t0 = time.monotonic()
    for i in range(COUNT):
        roll = rng.random()
        if roll < 0.08:
            path = rng.choice(["/", "/v1", "/v1/chat", "/v1/completions/x", "/%ff%fe", "/v1/models/nope", "/../etc/passwd"])
            status, body = request(port, rng.choice(["GET", "POST", "DELETE"]), path, b"{}")
        elif roll < 0.12:
            status, body = request(port, rng.choice(["GET", "PUT", "DELETE"]), "/v1/chat/completions")
            if status in (404, 405):
                check(status, body, "wrong method")
            counts[status] = counts.get(status, 0) + 1
            continue
        elif roll < 0.15:
            raw_exchange(port, rng.choice([b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999\r\n\r\n{",
                                           b"\x00\xff" * 50, b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n"]))
            counts["raw"] = counts.get("raw", 0) + 1
            continue
        else:
            path = rng.choice(["/v1/chat/completions", "/v1/completions"])
            status, body = request(port, "POST", path, body_bytes(), {"Content-Type": "application/json"})
        check(status, body, f"request {i}")
        counts[status] = counts.get(status, 0) + 1
    elapsed = time.monotonic() - t0
    # A streamed request's slot is given back just after its client read [DONE].
    wait_until(lambda: request(port, "GET", "/health")[1].get("busy") == 0, 10, "every slot free after the loop")
    status, health = request(port, "GET", "/health")
    assert status == 200 and health["status"] == "ok", health
    status, after = request(port, "POST", "/v1/completions", GOOD_COMPLETION)
    assert status == 200 and after["choices"][0]["text"] == before["choices"][0]["text"] == " Paris.\n", (before, after)
    assert counts.get(400, 0) > COUNT // 4, counts
    print(f"{COUNT} malformed requests in {elapsed:.1f} s; statuses {dict(sorted(counts.items(), key=str))}")
print("check_fuzz: all passed")
