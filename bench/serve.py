"""Requests per second and time to first token of examples/serve next to llama.cpp's
server (llama-cpp-python[server]) on the same file and the same number of threads, at
1, 4 and 16 concurrent clients. Not part of CI.

    .venv/bin/pip install -r bench/requirements-serve.txt
    .venv/bin/python bench/serve.py --build build [--threads 2] [--out bench/results/serve.md]

Each client sends streaming chat completions (temperature 0, max_tokens tokens) one
after another; TTFT is the time from sending a request to its first content event.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Explain what a CPU does.",
             "Write a haiku about rain.", "What is 12 times 7?", "Give me a fun fact about cats."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, path, seconds=120):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server on port {port} did not answer {path} within {seconds} s")


def one_request(port, i, max_tokens):
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    first, pieces, buf, done = None, 0, b"", False
    # A request ends for its client at [DONE]; what the server does with the connection
    # afterwards (sse-starlette keeps it a while) is not the request's time.
    while not done:
        try:
            chunk = r.read1(65536)
        except http.client.IncompleteRead:
            break
        if not chunk:
            break
        buf += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue  # comments and pings
            payload = event[len(b"data: "):]
            if payload == b"[DONE]":
                done = True
                break
            for choice in json.loads(payload).get("choices", []):
                if choice.get("delta", {}).get("content"):
                    pieces += 1
                    if first is None:
                        first = time.monotonic() - t0
    c.close()
    return first if first is not None else time.monotonic() - t0, time.monotonic() - t0, pieces


def load(port, clients, requests, max_tokens):
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda i: one_request(port, i, max_tokens), range(requests)))
    wall = time.monotonic() - t0
    ttft = sorted(r[0] for r in results)
    return {"rps": requests / wall, "ttft_median": statistics.median(ttft), "ttft_p90": ttft[int(0.9 * (len(ttft) - 1))],
            "tokens_per_s": sum(r[2] for r in results) / wall, "wall": wall}


def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--threads", type=int, default=2, help="threads per engine, in total")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", type=int, default=32, help="requests per level (at least the clients)")
    p.add_argument("--out")
    a = p.parse_args()
    levels = [int(x) for x in a.clients.split(",")]
    engines = [
        ("tlm, 1 slot x %d threads" % a.threads,
         lambda port: [os.path.join(a.build, "examples", "serve"), "--model", a.model, "--port", str(port), "--slots", "1",
                       "--threads", str(a.threads), "--queue", "64"]),
        ("tlm, %d slots x 1 thread" % a.threads,
         lambda port: [os.path.join(a.build, "examples", "serve"), "--model", a.model, "--port", str(port), "--slots",
                       str(a.threads), "--threads", "1", "--queue", "64"]),
    ]
    # llama.cpp's worker threads spin while they wait; on a loaded machine 2 threads can be
    # far slower than 1, so both are measured. Requests queue rather than interrupt each
    # other (its default, interrupt_requests, would cut a running stream short).
    for threads in sorted({a.threads, 1}, reverse=True):
        engines.append(("llama.cpp server, %d thread%s" % (threads, "s" if threads > 1 else ""),
                        lambda port, t=threads: [sys.executable, "-m", "llama_cpp.server", "--model", a.model, "--host",
                                                 "127.0.0.1", "--port", str(port), "--n_threads", str(t), "--n_threads_batch",
                                                 str(t), "--n_ctx", "2048", "--interrupt_requests", "False"]))
    rows = []
    for name, command in engines:
        port = free_port()
        proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, "/v1/models")
            one_request(port, 0, 4)  # warm-up
            for clients in levels:
                r = load(port, clients, max(a.requests, clients), a.max_tokens)
                rows.append((name, clients, r))
                print(f"{name}: {clients} clients: {r['rps']:.2f} requests/s, TTFT median {r['ttft_median'] * 1000:.0f} ms, "
                      f"p90 {r['ttft_p90'] * 1000:.0f} ms, {r['tokens_per_s']:.1f} tokens/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    table = ["| engine | clients | requests/s | TTFT median ms | TTFT p90 ms | streamed tokens/s |", "|---|---|---|---|---|---|"]
    for name, clients, r in rows:
        table.append(f"| {name} | {clients} | {r['rps']:.2f} | {r['ttft_median'] * 1000:.0f} | {r['ttft_p90'] * 1000:.0f} | "
                     f"{r['tokens_per_s']:.1f} |")
    text = "\n".join([
        "# HTTP serving: tlm's examples/serve vs llama.cpp's server (llama-cpp-python)", "",
        f"- Machine: {machine()}; load average {os.getloadavg()[0]:.2f} at the end; shared and noisy.",
        f"- Model: `{os.path.basename(a.model)}`; streaming chat completions, greedy, max_tokens {a.max_tokens}; "
        f"{a.requests} requests per level (or one per client if more), each client sending one after another.",
        f"- Both engines get {a.threads} threads in total (llama.cpp also 1). llama-cpp-python's server runs one "
        "request at a time (one llama context; `--interrupt_requests False` so that requests queue); tlm runs one "
        "request per slot. Its chat answers are not tlm's (it applies the template its own way), so the streamed "
        "token counts differ a little.",
        "- TTFT: from sending the request to the first content event.", "", *table, ""])
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
