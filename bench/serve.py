"""tlm's batched server (examples/serve) next to llama.cpp's own server (llama-server), on
the same GGUF file and the same total threads, side by side in one run. Not part of CI.

    bench/setup-llama-server                       # builds bench/.llama-server/build/bin/llama-server
    .venv/bin/python bench/serve.py --build build [--threads 2] [--rounds 2] [--out bench/results/serve-batching-<machine>.md]

Each level (1 / 4 / 16 / 32 concurrent clients, max_tokens 32 and 128) starts a fresh
server per engine with --parallel equal to the client count (--parallel N fixes it
instead), warms it up with one short request, and has every client send streaming chat
completions (greedy) one after another. The machine this was written for is shared, so
the engines are interleaved per level, tlm, then llama-server, then tlm again: both see
the same noise, and the two tlm runs show how large it is.

Every reply is exactly max_tokens long: the requests ban the model's end tokens with
logit_bias (both servers take OpenAI's {"token id": -100}), so both engines generate the
same number of tokens whatever their chat templates make the model say.

Per run: requests/s, generated tokens/s (all clients together; usage.completion_tokens
from the final streamed chunk), time to first token (from sending the request to its
first content event; median and p95 by nearest rank), the server's peak RSS (VmHWM
from /proc at the end of the run) and the mean batch (sequences per decode step, from
each server's /metrics over the run: tlm_decode_rows_total / tlm_decode_steps_total,
llama.cpp's n_busy_slots_per_decode times n_decode_total).

A shared-system-prompt variant (--shared-clients, default 16) measures time to first
token for a chat prompt of about 64 tokens whose system prompt every request repeats,
the case a prefix cache is for.

--engines llama-cpp-python adds llama-cpp-python's server (one request at a time; needs
`.venv/bin/pip install -r bench/requirements-serve.txt`).
"""
import argparse
import concurrent.futures
import http.client
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Explain what a CPU does.",
             "Write a haiku about rain.", "What is 12 times 7?", "Give me a fun fact about cats."]

# The shared system prompt of the TTFT variant: with SmolLM2's template and one short
# question it makes a prompt of about 64 tokens (the run prints the exact count).
SYSTEM = ("You are a concise assistant for a hardware shop. Answer in one or two sentences, "
          "politely, and never invent prices or stock levels. When a question is not about the shop, "
          "answer it briefly anyway.")

# SmolLM2's end tokens: <|endoftext|>, <|im_start|>, <|im_end|>.
END_TOKENS = [0, 1, 2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode("utf-8", "replace")


def wait_ready(proc, port, path, seconds=180):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server ({' '.join(proc.args)}) exited with status {proc.returncode} before answering")
        try:
            if get(port, path, 2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server on port {port} did not answer {path} within {seconds} s")


def messages_for(i, system):
    m = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    return [{"role": "system", "content": SYSTEM}] + m if system else m


def body_for(i, max_tokens, system, full_length, stream=True):
    b = {"model": "m", "messages": messages_for(i, system), "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if full_length:
        b["logit_bias"] = {str(t): -100 for t in END_TOKENS}
    return b


def one_request(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"the server answered {r.status}: {r.read()[:500]!r}")
    first, pieces, usage, buf, done = None, 0, None, b"", False
    # A request ends for its client at [DONE]; what the server does with the connection
    # afterwards is not the request's time.
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
            data = json.loads(payload)
            if "error" in data:
                raise SystemExit(f"the server sent an error event: {data['error']}")
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    pieces += 1
                    if first is None:
                        first = time.monotonic() - t0
    c.close()
    end = time.monotonic() - t0
    tokens = usage["completion_tokens"] if usage else pieces
    return first if first is not None else end, end, tokens


def prompt_tokens(port, system):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body_for(0, 1, system, False, stream=False)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    return data.get("usage", {}).get("prompt_tokens")


def nearest_rank(sorted_values, q):
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def load(port, clients, requests, max_tokens, system, full_length):
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda i: one_request(port, body_for(i, max_tokens, system, full_length)), range(requests)))
    wall = time.monotonic() - t0
    ttft = sorted(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    return {"requests": requests, "rps": requests / wall, "tokens_per_s": tokens / wall, "tokens": tokens,
            "ttft_median": statistics.median(ttft), "ttft_p95": nearest_rank(ttft, 0.95), "wall": wall}


def metrics(engine, port):
    """The counters the mean batch is computed from, as {name: value}."""
    if engine == "llama-cpp-python":
        return {}
    status, text = get(port, "/metrics")
    if status != 200:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)\s+([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def decode_steps(engine, before, after):
    name = {"tlm": "tlm_decode_steps_total", "llama-server": "llamacpp:n_decode_total"}.get(engine)
    return after.get(name, 0) - before.get(name, 0) if name else 0


def mean_batch(engine, before, after):
    if engine == "tlm":
        steps = after.get("tlm_decode_steps_total", 0) - before.get("tlm_decode_steps_total", 0)
        rows = after.get("tlm_decode_rows_total", 0) - before.get("tlm_decode_rows_total", 0)
        return rows / steps if steps else None
    if engine == "llama-server":
        def busy(m):
            return m.get("llamacpp:n_busy_slots_per_decode", 0) * m.get("llamacpp:n_decode_total", 0)
        steps = after.get("llamacpp:n_decode_total", 0) - before.get("llamacpp:n_decode_total", 0)
        return (busy(after) - busy(before)) / steps if steps else None
    return None


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def command(engine, a, port, parallel):
    if engine == "tlm":
        return [os.path.join(a.build, "examples", "serve"), "--model", a.model, "--port", str(port), "--parallel",
                str(parallel), "--threads", str(a.threads), "--queue", "256", "--ctx", str(a.ctx), "--max-tokens",
                str(a.ctx // 2)]
    if engine == "llama-server":
        # -c is the whole cache, split over the --parallel slots: a.ctx positions each.
        return [a.llama_server, "--model", a.model, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(parallel),
                "--threads", str(a.threads), "--threads-batch", str(a.threads), "-c", str(parallel * a.ctx),
                "--cont-batching", "--metrics", "--no-webui"]
    if engine == "llama-cpp-python":
        # One llama context, one request at a time; requests queue rather than interrupt
        # each other (its default would cut a running stream short).
        return [sys.executable, "-m", "llama_cpp.server", "--model", a.model, "--host", "127.0.0.1", "--port", str(port),
                "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads), "--n_ctx", str(a.ctx),
                "--interrupt_requests", "False"]
    raise SystemExit(f"unknown engine '{engine}'; --engines takes tlm, llama-server and llama-cpp-python")


def run(engine, a, clients, requests, max_tokens, system):
    """One fresh server, one warm-up request, one load; the row of the table."""
    parallel = a.parallel or clients
    port = free_port()
    load_before = os.getloadavg()[0]
    env = dict(os.environ)
    if engine == "tlm" and a.tlm_precision:
        env["TLM_PRECISION"] = a.tlm_precision
    proc = subprocess.Popen(command(engine, a, port, parallel), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_ready(proc, port, "/health" if engine != "llama-cpp-python" else "/v1/models")
        # The warm-up asks a question without the shared system prompt, so that the
        # shared-prompt variant starts with a cold cache.
        one_request(port, body_for(len(QUESTIONS) - 1, 4, False, False))
        prompt = prompt_tokens(port, system) if system else None
        before = metrics(engine, port)
        r = load(port, clients, requests, max_tokens, system, a.full_length)
        after = metrics(engine, port)
        r["mean_batch"] = mean_batch(engine, before, after)
        steps = decode_steps(engine, before, after)
        r["step_ms"] = r["wall"] * 1000 / steps if steps else None
        r["cached"] = (after.get("tlm_prefix_cache_tokens_total", 0) - before.get("tlm_prefix_cache_tokens_total", 0)
                       if engine == "tlm" else None)
        r["peak_rss_mib"] = peak_rss_mib(proc.pid)
        r["prompt_tokens"] = prompt
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    r.update(engine=engine, clients=clients, parallel=parallel, max_tokens=max_tokens, load=load_before)
    return r


def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def label(r, runs):
    same = [x for x in runs if x["engine"] == r["engine"] and x["clients"] == r["clients"] and x["round"] == r["round"]
            and x["max_tokens"] == r["max_tokens"] and x["system"] == r["system"]]
    n = sum(1 for x in same if x["order"] <= r["order"])
    return f"{r['engine']} ({'ab'[n - 1]})" if len(same) > 1 else r["engine"]


def fmt_opt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows, runs):
    out = ["| round | max_tokens | clients | engine | --parallel | requests | requests/s | generated tokens/s | TTFT median ms | "
           "TTFT p95 ms | peak RSS MiB | mean batch | ms per step | load (1 min) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['round']} | {r['max_tokens']} | {r['clients']} | {label(r, runs)} | {r['parallel']} | {r['requests']} | "
                   f"{r['rps']:.2f} | {r['tokens_per_s']:.1f} | {r['ttft_median'] * 1000:.0f} | {r['ttft_p95'] * 1000:.0f} | "
                   f"{r['peak_rss_mib']:.0f} | {fmt_opt(r['mean_batch'], '.1f')} | {fmt_opt(r['step_ms'], '.1f')} | {r['load']:.1f} |")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build", help="tlm's build directory (examples/serve)")
    p.add_argument("--llama-server", default="bench/.llama-server/build/bin/llama-server",
                   help="llama.cpp's server binary (bench/setup-llama-server builds it there)")
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--engines", default="tlm,llama-server",
                   help="comma-separated: tlm, llama-server, llama-cpp-python (default tlm,llama-server)")
    p.add_argument("--threads", type=int, default=2, help="threads per engine, in total")
    p.add_argument("--parallel", type=int, default=0, help="sequences per server (default 0: the client count)")
    p.add_argument("--ctx", type=int, default=512, help="positions per request, prompt plus max_tokens")
    p.add_argument("--max-tokens", default="32,128")
    p.add_argument("--clients", default="1,4,16,32")
    p.add_argument("--requests", type=int, default=16, help="requests per level (at least one per client)")
    p.add_argument("--shared-clients", type=int, default=16, help="clients of the shared-system-prompt variant (0: skip)")
    p.add_argument("--shared-requests", type=int, default=48)
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole sequence of runs")
    p.add_argument("--no-repeat", action="store_true", help="run tlm once per level instead of before and after the others")
    p.add_argument("--natural-length", dest="full_length", action="store_false",
                   help="let replies end at the model's end token (default: ban it, every reply max_tokens long)")
    p.add_argument("--tlm-precision", choices=["exact", "fast"],
                   help="TLM_PRECISION for tlm's server (default: unset, tlm's default, exact)")
    p.add_argument("--out")
    a = p.parse_args()
    engines = a.engines.split(",")
    if a.full_length and "smollm2" not in os.path.basename(a.model).lower():
        raise SystemExit(f"{a.model}: the end tokens banned to make every reply max_tokens long are SmolLM2's "
                         f"({END_TOKENS}); give --natural-length for another model")
    for e in engines:
        command(e, a, 0, 1)  # names an unknown engine now rather than mid-run
    if "llama-server" in engines and not os.access(a.llama_server, os.X_OK):
        raise SystemExit(f"{a.llama_server} is not there; run bench/setup-llama-server first (or give --llama-server PATH)")
    if "llama-cpp-python" in engines and subprocess.run(
            [sys.executable, "-c", "import uvicorn, fastapi, sse_starlette, starlette_context, pydantic_settings, llama_cpp"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        raise SystemExit(f"the llama-cpp-python engine needs its server's packages in {sys.executable}'s environment: "
                         f"{sys.executable} -m pip install -r bench/requirements-serve.txt (and llama-cpp-python)")
    if "tlm" in engines and not os.access(os.path.join(a.build, "examples", "serve"), os.X_OK):
        raise SystemExit(f"{a.build}/examples/serve is not there; build the target examples/serve in --build")
    # tlm, the others, tlm again: each level's runs see the same noise.
    order = [e for e in engines if e == "tlm"] + [e for e in engines if e != "tlm"]
    if "tlm" in engines and len(engines) > 1 and not a.no_repeat:
        order.append("tlm")
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = []

    def record(r, system, round_):
        r["order"], r["system"], r["round"] = len(runs), system, round_
        runs.append(r)
        print(f"round {round_}: {label(r, runs)}: max_tokens {r['max_tokens']}, {r['clients']} clients{' (shared system prompt)' if system else ''}: "
              f"{r['rps']:.2f} requests/s, {r['tokens_per_s']:.1f} tokens/s, TTFT median {r['ttft_median'] * 1000:.0f} ms, "
              f"p95 {r['ttft_p95'] * 1000:.0f} ms, peak RSS {r['peak_rss_mib']:.0f} MiB, mean batch "
              f"{fmt_opt(r['mean_batch'], '.1f')}, {fmt_opt(r['step_ms'], '.1f')} ms per step, load {r['load']:.1f}", flush=True)

    for round_ in range(1, a.rounds + 1):
        for max_tokens in [int(x) for x in a.max_tokens.split(",")]:
            for clients in [int(x) for x in a.clients.split(",")]:
                for engine in order:
                    record(run(engine, a, clients, max(a.requests, clients), max_tokens, False), False, round_)
        if a.shared_clients:
            for engine in order:
                record(run(engine, a, a.shared_clients, max(a.shared_requests, a.shared_clients), 32, True), True, round_)
    load_end = os.getloadavg()

    plain = [r for r in runs if not r["system"]]
    shared = [r for r in runs if r["system"]]
    lines = [
        "# HTTP serving with batching: tlm's examples/serve vs llama.cpp's llama-server", "",
        f"- Machine: {machine()}; run started {started}; load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.2f}' for x in load_start)} at the start and {', '.join(f'{x:.2f}' for x in load_end)} "
        "at the end. The machine's cores may be shared with other work (noise): each level runs "
        f"tlm, then llama-server, then tlm again (a) and (b), the whole sequence {a.rounds} time(s) (round), and the load column is the 1-minute load average when "
        "each run started.",
        f"- Model: `{os.path.basename(a.model)}`. Each run is a fresh server with --parallel "
        f"{a.parallel or 'equal to the client count'}, {a.threads} threads in total "
        f"(tlm `--threads {a.threads}`; llama-server `--threads {a.threads} --threads-batch {a.threads}`), "
        f"{a.ctx} positions per request (llama-server `-c` = parallel x {a.ctx}, `--cont-batching`), one warm-up request, "
        f"then {a.requests} requests (or one per client if more), each client sending streaming chat completions "
        "(greedy) one after another.",
        "- " + ("Every reply is exactly max_tokens long: the end tokens are banned with logit_bias -100."
                if a.full_length else "Replies end at the model's end token or max_tokens."),
        "- Generated tokens/s: usage.completion_tokens of all requests over the run's wall time. TTFT: from sending a "
        "request to its first content event (median and p95 by nearest rank). Peak RSS: the server's VmHWM at the end "
        "of the run. Mean batch: sequences per decode step over the run (tlm: tlm_decode_rows_total / "
        "tlm_decode_steps_total; llama-server: n_busy_slots_per_decode). Ms per step: the run's wall time over its "
        "decode steps (tlm_decode_steps_total; llama-server's n_decode_total), prompt chunks run between them included.",
        f"- tlm's kernel precision: {a.tlm_precision or 'exact (its default; TLM_PRECISION unset)'}; llama.cpp "
        "quantizes activations to 8 bits for quantized weights.",
        "- Caches: tlm f32 KV caches (its default), llama-server f16 (its default); both keep their prefix / prompt "
        "cache on (their defaults).", "", *table(plain, runs), ""]
    if shared:
        pt = ", ".join(sorted({f"{r['engine']} {r['prompt_tokens']}" for r in shared}))
        lines += [f"## Shared system prompt: {a.shared_clients} clients, TTFT", "",
                  f"Every request repeats one system prompt and asks one of {len(QUESTIONS)} short questions; prompt tokens "
                  f"as each server counts them (usage.prompt_tokens of question 0): {pt}. max_tokens 32, "
                  f"{max(a.shared_requests, a.shared_clients)} requests from {a.shared_clients} clients; the first "
                  f"{a.shared_clients} arrive together. tlm's prompt tokens taken from its prefix cache over the run: "
                  f"{', '.join(str(int(r['cached'])) for r in shared if r['cached'] is not None)}.", "",
                  *table(shared, runs), ""]
    text = "\n".join(lines)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
