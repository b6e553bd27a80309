"""GET /metrics and GET /slots: the exposition text parsed strictly; after known requests
the request counters, token counters, histogram counts and KV cache bytes equal what was
sent and answered; during a long stream /slots shows its slot generating; both routes
need the API key."""
import http.client
import json
import math
import re
import time

from serve_common import arguments, request, server, wait_until

args = arguments()

KEY = "metrics-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SLOTS = 2
CTX = 4096  # serve's default --ctx
# SmolLM2-135M's KV cache per position, f32: keys and values, 30 layers, 3 kv heads of 64.
KV_BYTES_PER_POSITION = 2 * 30 * 3 * 64 * 4
# <|endoftext|>, <|im_start|>, <|im_end|>: kept from being sampled, so that every reply
# runs to max_tokens and the counts below do not depend on where the model would stop.
NO_END = {"0": -100, "1": -100, "2": -100}

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse(text):
    """Prometheus' text format 0.0.4, strictly: HELP then TYPE before a family's samples,
    every other line `name{labels} value`, counters named *_total, histogram buckets
    ascending and cumulative, ending with +Inf equal to _count. Returns
    {(name, frozenset of label pairs): value}."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families, samples, current = {}, {}, None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"a second HELP for {name}"
            assert help_text, f"an empty HELP for {name}"
            families[name] = {"type": None, "samples": []}
            current = name
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert name == current and families[name]["type"] is None and not families[name]["samples"], line
            assert kind in ("counter", "gauge", "histogram"), line
            if kind == "counter":
                assert name.endswith("_total"), f"counter {name} is not named *_total"
            families[name]["type"] = kind
            continue
        assert not line.startswith("#"), f"an unknown comment line: {line!r}"
        m = SAMPLE.match(line)
        assert m, f"not `name{{labels}} value`: {line!r}"
        name, label_text, value_text = m.groups()
        labels = {}
        if label_text is not None:
            pairs = LABEL.findall(label_text)
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == label_text, f"malformed labels: {line!r}"
            labels = dict(pairs)
            assert len(labels) == len(pairs), f"a repeated label: {line!r}"
        value = float(value_text)
        assert not math.isnan(value), line
        family = current
        assert family is not None and families[family]["type"] is not None, f"a sample before its HELP and TYPE: {line!r}"
        kind = families[family]["type"]
        if kind == "histogram":
            assert name in (family + "_bucket", family + "_sum", family + "_count"), f"{name} outside {family}"
        else:
            assert name == family, f"{name} under the HELP of {family}"
        if kind == "counter" or name.endswith(("_bucket", "_count")):
            assert value >= 0, line
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"a repeated sample: {line!r}"
        samples[key] = value
        families[family]["samples"].append((name, labels, value))
    for family, f in families.items():
        if f["type"] != "histogram":
            continue
        buckets = [(s[1]["le"], s[2]) for s in f["samples"] if s[0] == family + "_bucket"]
        assert buckets and buckets[-1][0] == "+Inf", f"{family}: the buckets do not end with +Inf"
        bounds = [float(le) for le, _ in buckets]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), f"{family}: bounds {bounds}"
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{family}: buckets not cumulative: {counts}"
        count = samples[(family + "_count", frozenset())]
        assert counts[-1] == count, f"{family}: +Inf {counts[-1]} != _count {count}"
        assert (family + "_sum", frozenset()) in samples, f"{family}: no _sum"
    return samples, {name: f["type"] for name, f in families.items()}


scrapes = 0  # /metrics and /slots answer 200 and count themselves; the test counts them too
slot_reads = 0


def metrics(port):
    global scrapes
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers=AUTH)
        r = conn.getresponse()
        body = r.read().decode()
        assert r.status == 200, (r.status, body)
        assert r.getheader("Content-Type") == "text/plain; version=0.0.4", r.getheader("Content-Type")
    finally:
        conn.close()
    scrapes += 1
    return parse(body)


def slots(port):
    global slot_reads
    status, body = request(port, "GET", "/slots", headers=AUTH)
    assert status == 200, (status, body)
    slot_reads += 1
    assert [s["id"] for s in body] == list(range(SLOTS)), body
    for s in body:
        assert set(s) == {"id", "state", "request_id", "prompt_tokens", "generated_tokens", "cached_tokens", "ctx", "started"}, s
        assert s["ctx"] == CTX, s
        assert s["state"] in ("idle", "prefill", "generating"), s
        if s["state"] == "idle":
            assert s["request_id"] is None and s["started"] is None, s
        else:
            assert isinstance(s["request_id"], str) and s["started"] >= 0, s
    return body


def value(samples, name, **labels):
    return samples[(name, frozenset((k, str(v)) for k, v in labels.items()))]


def post(port, path, body, headers=AUTH):
    return request(port, "POST", path, body, headers=dict(headers, **{"Content-Type": "application/json"}))


def stream(port, path, body):
    """A streamed request with include_usage; returns its usage."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
                     headers=dict(AUTH, **{"Content-Type": "application/json"}))
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        usage = None
        for event in r.read().decode().split("\n\n"):
            if event and event != "data: [DONE]":
                chunk = json.loads(event[len("data: "):])
                usage = chunk.get("usage") or usage
        assert usage, "no usage chunk"
        return usage
    finally:
        conn.close()


t0 = time.monotonic()
with server(args.build, args.model, "--slots", str(SLOTS), "--threads", "1", "--api-key", KEY,
            "--max-body", "4096", "--queue", "0") as port:
    # Before any request: the gauges, and no cache yet (a sequence's is made by its first request).
    samples, types = metrics(port)
    assert types == {"tlm_requests_total": "counter", "tlm_prompt_tokens_total": "counter",
                     "tlm_generated_tokens_total": "counter", "tlm_time_to_first_token_seconds": "histogram",
                     "tlm_time_per_output_token_seconds": "histogram", "tlm_queue_length": "gauge",
                     "tlm_active_sequences": "gauge", "tlm_slots": "gauge", "tlm_kv_cache_bytes": "gauge",
                     "tlm_prefix_cache_hits_total": "counter", "tlm_prefix_cache_tokens_total": "counter",
                     "tlm_prefix_cache_running_copies_total": "counter",
                     "tlm_decode_steps_total": "counter", "tlm_decode_rows_total": "counter"}, types
    assert value(samples, "tlm_slots") == SLOTS
    assert value(samples, "tlm_active_sequences") == 0 and value(samples, "tlm_queue_length") == 0
    assert value(samples, "tlm_kv_cache_bytes") == 0, value(samples, "tlm_kv_cache_bytes")
    assert value(samples, "tlm_prefix_cache_hits_total") == 0 and value(samples, "tlm_decode_steps_total") == 0
    assert not any(name == "tlm_requests_total" for name, _ in samples), "requests counted before any was answered"
    for h, lo, hi in (("tlm_time_to_first_token_seconds", 0.005, 60), ("tlm_time_per_output_token_seconds", 0.001, 2.5)):
        bounds = sorted(float(dict(labels)["le"]) for name, labels in samples if name == h + "_bucket")
        assert bounds[0] == lo and bounds[-2] == hi and bounds[-1] == math.inf, (h, bounds)
    assert all(s["state"] == "idle" and s["prompt_tokens"] == 0 for s in slots(port))

    # Both routes need the key.
    for path in ("/metrics", "/slots"):
        status, body = request(port, "GET", path)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (path, status, body)
        status, _ = request(port, "GET", path, headers={"Authorization": "Bearer wrong"})
        assert status == 401, (path, status)

    # Known requests, one at a time: each takes the idle sequence whose cache shares the
    # longest prefix with its prompt (the chats share the template's default system
    # turn), else the least recently used one.
    usages = []
    for path, body, streamed in [
            ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6}, False),
            ("/v1/completions", {"prompt": "Water boils at", "max_tokens": 9}, True),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 5}, False),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 7}, True),
            ("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 4}, False),
            # One token: a time to first token, no time per output token.
            ("/v1/completions", {"prompt": "Hello", "max_tokens": 1}, False)]:
        body = dict(body, temperature=0, logit_bias=NO_END)
        if streamed:
            u = stream(port, path, body)
        else:
            status, r = post(port, path, body)
            assert status == 200, (status, r)
            u = r["usage"]
        assert u["completion_tokens"] == body["max_tokens"], u
        usages.append(u)
        assert u["prompt_tokens"] + body["max_tokens"] - 1 <= 256  # so each sequence's cache is 256 positions
    # Refusals: a missing prompt (400), an unknown path (404), no key (401), a body over
    # --max-body (413).
    status, _ = post(port, "/v1/completions", {"max_tokens": 3})
    assert status == 400, status
    status, _ = request(port, "GET", "/no/such/route", headers=AUTH)
    assert status == 404, status
    # Connection: close, because httplib 0.11 answers the 401 without reading the body
    # and, on a kept-alive connection, would read that body as the next request (a 400
    # "other" in the counts below); a request's Connection: close ends the connection.
    status, _ = post(port, "/v1/completions", {"prompt": "hi"}, headers={"Connection": "close"})
    assert status == 401, status
    status, _ = post(port, "/v1/completions", {"prompt": "x" * 5000})
    assert status == 413, status
    # The other routes' labels; a model id names no series of its own.
    for path, want in (("/v1/models", 200), ("/health", 200), ("/v1/models/other-model", 404)):
        status, _ = request(port, "GET", path, headers=AUTH)
        assert status == want, (path, status)

    samples, _ = metrics(port)
    requests = {tuple(sorted(dict(labels).items())): v for (name, labels), v in samples.items()
                if name == "tlm_requests_total"}
    expected = {("/v1/completions", "200"): 4, ("/v1/chat/completions", "200"): 2, ("/v1/completions", "400"): 1,
                ("other", "404"): 1, ("/v1/completions", "401"): 1, ("/v1/completions", "413"): 1,
                ("/metrics", "401"): 2, ("/slots", "401"): 2, ("/metrics", "200"): scrapes - 1,
                ("/slots", "200"): slot_reads, ("/v1/models", "200"): 1, ("/health", "200"): 1,
                ("/v1/models/{id}", "404"): 1}
    assert requests == {(("endpoint", e), ("status", s)): n for (e, s), n in expected.items()}, requests
    generations = len(usages)
    assert value(samples, "tlm_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert value(samples, "tlm_generated_tokens_total") == sum(u["completion_tokens"] for u in usages)
    two_or_more = sum(u["completion_tokens"] >= 2 for u in usages)
    assert two_or_more == generations - 1
    for h, n in (("tlm_time_to_first_token_seconds", generations), ("tlm_time_per_output_token_seconds", two_or_more)):
        assert value(samples, h + "_count") == n, (h, value(samples, h + "_count"), n)
        assert value(samples, h + "_sum") > 0, h
    # Both sequences served some of the six requests; each cache is rounded up to 256 positions.
    assert value(samples, "tlm_kv_cache_bytes") == SLOTS * 256 * KV_BYTES_PER_POSITION, value(samples, "tlm_kv_cache_bytes")
    # The second chat found the first one's system turn in a cache.
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert cached[3] > 0, cached
    assert value(samples, "tlm_prefix_cache_hits_total") == sum(c > 0 for c in cached), cached
    assert value(samples, "tlm_prefix_cache_tokens_total") == sum(cached), cached
    # One request at a time: no prefix came from a running sequence.
    assert value(samples, "tlm_prefix_cache_running_copies_total") == 0
    steps, rows = value(samples, "tlm_decode_steps_total"), value(samples, "tlm_decode_rows_total")
    # One request at a time: one row a step, a step for every generated token but the last.
    assert rows == steps == sum(u["completion_tokens"] - 1 for u in usages), (steps, rows, usages)
    assert value(samples, "tlm_active_sequences") == 0 and value(samples, "tlm_queue_length") == 0

    # A long stream: its slot shows it generating, its tokens growing.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True,
                                  "stream_options": {"include_usage": True}, "logit_bias": NO_END}),
                 headers=dict(AUTH, **{"Content-Type": "application/json"}))
    r = conn.getresponse()
    assert r.status == 200, r.status
    first = r.readline().decode()
    assert first.startswith("data: "), first
    stream_id = json.loads(first[len("data: "):])["id"]
    seen = []

    def generating():
        view = slots(port)
        busy = [s for s in view if s["state"] != "idle"]
        if not busy:
            return False  # still in the scheduler's queue
        assert len(busy) == 1 and busy[0]["request_id"] == stream_id, view
        if busy[0]["state"] == "generating" and busy[0]["generated_tokens"] > 0:
            seen.append(busy[0])
        return len(seen) >= 2 and seen[-1]["generated_tokens"] > seen[0]["generated_tokens"]

    wait_until(generating, 60, "the stream's slot generating, its generated_tokens growing")
    assert seen[-1]["started"] >= seen[0]["started"], seen
    samples, _ = metrics(port)
    assert value(samples, "tlm_active_sequences") == 1
    # Generated tokens are counted as they come, not when the reply ends.
    assert value(samples, "tlm_generated_tokens_total") >= sum(u["completion_tokens"] for u in usages) + \
        seen[-1]["generated_tokens"]

    # A second stream takes the other slot; with both busy and --queue 0 a third request
    # is refused with 503, and counted.
    conn2 = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn2.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": "Water boils at", "max_tokens": 20, "temperature": 0, "stream": True,
                                   "stream_options": {"include_usage": True}, "logit_bias": NO_END}),
                  headers=dict(AUTH, **{"Content-Type": "application/json"}))
    r2 = conn2.getresponse()
    assert r2.status == 200 and r2.readline().startswith(b"data: "), r2.status
    # The first event is sent before the scheduler has taken the request from its queue.
    wait_until(lambda: all(s["state"] != "idle" for s in slots(port)), 60, "both sequences busy")
    status, body = post(port, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 503 and body["error"]["code"] == "server_busy", (status, body)
    samples, _ = metrics(port)
    assert value(samples, "tlm_active_sequences") == 2 and value(samples, "tlm_queue_length") == 0
    assert value(samples, "tlm_requests_total", endpoint="/v1/completions", status=503) == 1

    def finish(response, connection, max_tokens):
        rest = response.read().decode()
        connection.close()
        assert rest.rstrip().endswith("data: [DONE]"), rest[-200:]
        usage = [json.loads(e[len("data: "):]) for e in rest.split("\n\n") if e.startswith("data: {")][-1]["usage"]
        assert usage["completion_tokens"] == max_tokens, usage
        return usage

    usage = finish(r, conn, 200)
    assert seen[0]["prompt_tokens"] == usage["prompt_tokens"], (seen[0], usage)
    usage2 = finish(r2, conn2, 20)
    assert all(s["state"] == "idle" and s["generated_tokens"] == 0 for s in slots(port))
    samples, _ = metrics(port)
    assert value(samples, "tlm_active_sequences") == 0
    assert value(samples, "tlm_generated_tokens_total") == sum(u["completion_tokens"] for u in usages) + 220
    assert value(samples, "tlm_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages + [usage, usage2])
    for h, n in (("tlm_time_to_first_token_seconds", generations), ("tlm_time_per_output_token_seconds", two_or_more)):
        assert value(samples, h + "_count") == n + 2, h
    assert value(samples, "tlm_requests_total", endpoint="/v1/completions", status=200) == 6

elapsed = time.monotonic() - t0
print(f"metrics: ok ({elapsed:.1f} s)")
