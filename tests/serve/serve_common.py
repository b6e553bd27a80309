"""What the server tests share: starting examples/serve on a free loopback port,
plain HTTP requests, and the reference answers from examples/generate."""
import argparse
import contextlib
import http.client
import json
import os
import subprocess
import time


def arguments(**switches):
    """The checks' common arguments; each keyword names a check's own on/off switch
    (`--name-with-dashes`) and gives its help text."""
    p = argparse.ArgumentParser()
    p.add_argument("--build", required=True, help="the CMake build folder")
    p.add_argument("--model", required=True, help="the GGUF file")
    for name, help_text in switches.items():
        p.add_argument("--" + name.replace("_", "-"), action="store_true", help=help_text)
    return p.parse_args()


@contextlib.contextmanager
def server(build, model, *flags):
    """Runs serve with --port 0 (the kernel picks a free port, so parallel tests never
    clash) and yields that port; the server is stopped with SIGTERM and must exit 0."""
    with server_process(build, model, *flags) as (port, _):
        yield port


@contextlib.contextmanager
def server_process(build, model, *flags, host="127.0.0.1"):
    """server(), yielding (port, the subprocess.Popen) for tests that watch the process."""
    exe = os.path.join(build, "examples", "serve")
    shown = f"[{host}]" if ":" in host else host
    proc = subprocess.Popen([exe, "--model", model, "--port", "0", "--host", host, *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if f"listening on http://{shown}:" not in line:
            proc.kill()
            raise SystemExit(f"serve did not start: {line!r} {proc.stderr.read()}")
        port = int(line.split(f"{shown}:")[1].split()[0])
        yield port, proc
        assert proc.poll() is None, f"serve exited early with {proc.returncode}: {proc.stderr.read()}"
    finally:
        if proc.poll() is not None and proc.returncode != 0:
            # Died under the test (a crash, a sanitizer stopping it): say so, with its stderr,
            # beside whatever error the lost connection raised in the test.
            raise AssertionError(f"serve died with exit code {proc.returncode}: {proc.stderr.read()}")
        if proc.poll() is None:
            proc.terminate()
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError("serve did not stop within 30 s of SIGTERM")
            if code != 0:
                raise AssertionError(f"serve exited with {code} after SIGTERM: {proc.stderr.read()}")


def request(port, method, path, body=None, headers=None, timeout=120, host="127.0.0.1"):
    """Returns (status, parsed JSON or raw text)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw.decode("utf-8", "replace")
    finally:
        conn.close()


def stream_text(port, path, body, timeout=120):
    """Posts a streaming request; returns (text, finish_reason, number of events)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type", "").startswith("text/event-stream"), r.getheader("Content-Type")
        text, finish, events, done = "", None, 0, False
        for event in r.read().decode().split("\n\n"):
            if not event:
                continue
            assert event.startswith("data: "), event
            payload = event[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "an event after [DONE]"
            chunk = json.loads(payload)
            events += 1
            for c in chunk["choices"]:
                text += c["delta"].get("content", "") if "delta" in c else c["text"]
                finish = c["finish_reason"] or finish
        assert done, "the stream did not end with data: [DONE]"
        return text, finish, events
    finally:
        conn.close()


def generate_reference(build, model, prompt, max_tokens, chat=False):
    """The greedy continuation examples/generate prints for the same prompt."""
    exe = os.path.join(build, "examples", "generate")
    args = [exe, "--model", model, "--threads", "1", "-n", str(max_tokens)]
    if chat:
        args.append("--chat")
    out = subprocess.run(args + [prompt], check=True, capture_output=True, text=True).stdout
    assert out.endswith("\n"), out
    out = out[:-1]
    if chat:
        marker = "<|im_start|>assistant\n"
        assert marker in out, out
        return out.split(marker, 1)[1]
    assert out.startswith(prompt), out
    return out[len(prompt):]


def wait_until(predicate, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what}")


def rss_mib(pid):
    """The resident memory of a process, in MiB (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
