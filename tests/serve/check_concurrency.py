"""Slots and the queue: 200 requests from 16 client threads at temperature 0 each
answer exactly what the same request answered alone; a client that disconnects
mid-stream frees its slot; a full queue answers 503."""
import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import time

from serve_common import arguments, request, server, stream_text, wait_until

args = arguments()

PROMPTS = ["The capital of France is", "Water boils at", "def add(a, b):", "My favourite colour is",
           "The quick brown fox", "In 1969, the first", "Photosynthesis is", "import numpy as np\n"]
QUESTIONS = ["What is 2+2?", "Name a fruit.", "Who wrote Hamlet?", "Say hello in French."]


def job(i):
    """The i-th request: completions and chats, streamed or not, of varying lengths;
    24 distinct requests, each sent about 8 times."""
    i %= 24
    chat = i % 3 == 0
    body = {"temperature": 0, "max_tokens": 4 + (i * 7) % 13}
    if chat:
        body["messages"] = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    else:
        body["prompt"] = PROMPTS[i % len(PROMPTS)]
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, i % 2 == 1


def answer(port, path, body, stream):
    if stream:
        text, finish, _ = stream_text(port, path, body)
        return text, finish
    status, r = request(port, "POST", path, body)
    assert status == 200, (status, r)
    c = r["choices"][0]
    return (c["message"]["content"] if "message" in c else c["text"]), c["finish_reason"]


def open_stream(port, body):
    """Starts a streaming completion and reads its first event; returns the socket."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    payload = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    got = b""
    while b"data: " not in got:
        more = s.recv(4096)
        assert more, "the server closed the stream before its first event"
        got += more
    return s


with server(args.build, args.model, "--slots", "2", "--threads", "1", "--queue", "32") as port:
    jobs = [job(i) for i in range(200)]
    distinct = {json.dumps([p, b, s], sort_keys=True): (p, b, s) for p, b, s in jobs}
    t0 = time.monotonic()
    alone = {k: answer(port, *v) for k, v in distinct.items()}
    t_alone = time.monotonic() - t0
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda j: answer(port, *j), jobs))
    t_together = time.monotonic() - t0
    for (p, b, s), got in zip(jobs, results):
        want = alone[json.dumps([p, b, s], sort_keys=True)]
        assert got == want, f"{p} {b} stream={s}: concurrently {got!r}, alone {want!r}"
    assert len({r[0] for r in results}) > 10, "the answers are suspiciously alike"
    # A stream's slot is given back when httplib drops the response, just after the
    # client has read [DONE], so the last one may still be held for a moment.
    wait_until(lambda: request(port, "GET", "/health")[1] == {"status": "ok", "slots": 2, "busy": 0, "queued": 0}, 10,
               "every slot free and nothing queued after the run")
    print(f"200 requests from 16 threads: all equal to the request alone; {len(distinct)} distinct requests alone "
          f"in {t_alone:.1f} s, 200 concurrently in {t_together:.1f} s ({200 / t_together:.1f} requests/s)")

with server(args.build, args.model, "--slots", "1", "--threads", "1", "--queue", "0", "--max-tokens", "3000") as port:
    # A long stream holds the only slot; with no queue, another request is refused at once.
    s = open_stream(port, {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "stop": ["zzzzzz"]})
    # Its first event may come before the scheduler takes it from the queue.
    wait_until(lambda: request(port, "GET", "/health")[1]["busy"] == 1, 20, "the stream running")
    status, r = request(port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 503 and r["error"]["code"] == "server_busy", (status, r)
    # The client goes away: its generation stops and the slot is free long before 3000 tokens.
    t0 = time.monotonic()
    s.close()
    wait_until(lambda: request(port, "GET", "/health")[1]["busy"] == 0, 20, "the disconnected stream's slot is freed")
    freed = time.monotonic() - t0
    status, r = request(port, "POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3,
                                                           "temperature": 0})
    assert status == 200 and r["choices"][0]["text"] == " Paris.\n", (status, r)
    print(f"disconnect freed the slot after {freed:.2f} s; queue full gave 503")
    # A non-streaming client that leaves: the server watches its connection while the
    # reply is generated, and ends the request (3000 tokens would take half a minute).
    raw = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0,
                       "logit_bias": {"0": -100, "1": -100, "2": -100}}).encode()
    raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    wait_until(lambda: request(port, "GET", "/health")[1]["busy"] == 1, 20, "the non-streaming request running")
    time.sleep(0.5)
    t0 = time.monotonic()
    raw.close()
    wait_until(lambda: request(port, "GET", "/health")[1]["busy"] == 0, 20,
               "the non-streaming request ended after its client left")
    freed = time.monotonic() - t0
    assert freed < 5, freed
    status, r = request(port, "POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3,
                                                           "temperature": 0})
    assert status == 200 and r["choices"][0]["text"] == " Paris.\n", (status, r)
    print(f"a non-streaming client that left freed its sequence after {freed:.2f} s")

# SIGTERM while a long stream runs: the generation ends at its next token and the
# server exits 0 at once, rather than after 3000 tokens.
exe = os.path.join(args.build, "examples", "serve")
proc = subprocess.Popen([exe, "--model", args.model, "--port", "0", "--slots", "1", "--threads", "1", "--max-tokens", "3000"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    port = int(proc.stdout.readline().split("127.0.0.1:")[1].split()[0])
    s = open_stream(port, {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "stop": ["zzzzzz"]})
    t0 = time.monotonic()
    proc.terminate()
    code = proc.wait(timeout=60)
    stopped = time.monotonic() - t0
    s.close()
    assert code == 0, (code, proc.stderr.read())
    assert stopped < 10, f"the server took {stopped:.1f} s to stop during a stream"
    print(f"SIGTERM during a stream: exited 0 after {stopped:.2f} s")
finally:
    if proc.poll() is None:
        proc.kill()
print("check_concurrency: all passed")
