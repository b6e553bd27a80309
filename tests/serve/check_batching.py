"""Continuous batching and the prefix cache through the HTTP API: 16 concurrent greedy
requests of different lengths, each answered as it is by a server that runs one request at
a time; a chat continued over 5 turns answered as with the prefix cache off, with the cache's
hits in /metrics and in usage.prompt_tokens_details.cached_tokens.

With --no-baseline (the ThreadSanitizer run) the two servers that give the expected
answers (one request at a time, the prefix cache off) are not started: they share no data
between threads, and they are most of the check's time (5.2 s of 8.8 s in a Release build;
the check took 94 s under the sanitizer with them). Everything else is asserted as in the
Release run, which compares the answers."""
import threading
import time

from serve_common import arguments, request, server

args = arguments(no_baseline="skip the one-at-a-time and cache-off servers and the comparisons with them")

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are",
           "In 1492,", "Water boils at", "A haiku about the sea:", "The quick brown fox", "To make bread you need",
           "The largest planet in the solar system is", "Hello! My name is", "List of prime numbers: 2, 3, 5,",
           "The opposite of hot is", "Photosynthesis is the process by which plants", "SELECT * FROM",
           "Translate to French: good morning ->"]


def completion(port, i):
    body = {"prompt": PROMPTS[i], "max_tokens": 4 + i % 5 * 4, "temperature": 0}
    status, r = request(port, "POST", "/v1/completions", body)
    assert status == 200, (status, r)
    return r["choices"][0]["text"], r["choices"][0]["finish_reason"]


def metric(port, name):
    status, text = request(port, "GET", "/metrics")
    assert status == 200, status
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


t0 = time.monotonic()
alone = None
if not args.no_baseline:
    with server(args.build, args.model, "--parallel", "1", "--threads", "1", "--no-prefix-cache") as port:
        alone = [completion(port, i) for i in range(len(PROMPTS))]

with server(args.build, args.model, "--parallel", "16", "--threads", "1") as port:
    got = [None] * len(PROMPTS)
    barrier = threading.Barrier(len(PROMPTS))

    def client(i):
        barrier.wait()
        got[i] = completion(port, i)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, g in enumerate(got):
        assert g is not None and g[1] in ("length", "stop"), (PROMPTS[i], g)
        assert alone is None or alone[i] == g, (PROMPTS[i], alone[i], g)
    steps, rows = metric(port, "tlm_decode_steps_total"), metric(port, "tlm_decode_rows_total")
    # The requests were decoded together: more than one sequence a step on average.
    assert rows > 1.5 * steps, (steps, rows)
    compared = "equal to one at a time" if alone is not None else "answered (not compared: --no-baseline)"
    print(f"batching: 16 concurrent requests {compared}; {rows:.0f} rows in {steps:.0f} steps")

QUESTIONS = ["What is the capital of France?", "And of Spain?", "Which of the two is larger?",
             "Name a river in one of them.", "Thank you. Say goodbye in French."]


def conversation(port):
    messages, replies, cached = [{"role": "system", "content": "You answer in one short sentence."}], [], []
    for q in QUESTIONS:
        messages.append({"role": "user", "content": q})
        status, r = request(port, "POST", "/v1/chat/completions",
                            {"messages": messages, "max_tokens": 24, "temperature": 0})
        assert status == 200, (status, r)
        text = r["choices"][0]["message"]["content"]
        replies.append(text)
        cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages.append({"role": "assistant", "content": text})
    return replies, cached


cold = None
if not args.no_baseline:
    with server(args.build, args.model, "--parallel", "2", "--threads", "1", "--no-prefix-cache") as port:
        cold, cold_cached = conversation(port)
        assert cold_cached == [0] * 5, cold_cached
        assert metric(port, "tlm_prefix_cache_hits_total") == 0

with server(args.build, args.model, "--parallel", "2", "--threads", "1") as port:
    warm, cached = conversation(port)
    assert cold is None or warm == cold, (warm, cold)
    # From the second turn on, the conversation so far is in the cache.
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    assert all(b > a for a, b in zip(cached[1:], cached[2:])), cached
    assert metric(port, "tlm_prefix_cache_hits_total") == 4
    assert metric(port, "tlm_prefix_cache_tokens_total") == sum(cached)
    compared = "equal to the cache off" if cold is not None else "answered (not compared: --no-baseline)"
    print(f"prefix cache: 5 turns {compared}; cached tokens per turn {cached}")

print(f"batching: ok ({time.monotonic() - t0:.1f} s)")
