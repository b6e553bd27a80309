"""Connections and the server's lifecycle: 40 clients each sending a header line every
2 s do not starve /health or a completion; a connection that stops sending within a
request is closed after --read-timeout, one that sends nothing at all after 2 s; on SIGTERM a stream being generated ends with an error event
(no finish_reason, no [DONE]), a non-streamed one gets 503, a queued one 503, and the
server exits 0; --max-connections, and the listen backlog it sets (64 clients connecting at
once are all answered). Also: the Bearer scheme in any case, CORS (--cors) and OPTIONS,
unguessable request ids, the "model" field not checked, --host ::1 printed as a URL; a refusal
sent before its body was read closes the connection (no keep-alive desync)."""
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import threading
import time

from serve_common import arguments, request, server, server_process, wait_until

args = arguments()
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}

# The defaults of --slots and --queue: the old fixed pool had slots + queue + 4 = 38 workers.
with server(args.build, args.model, "--threads", "1", "--read-timeout", "3") as port:
    slow = []
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    stop = threading.Event()

    def trickle():
        while not stop.wait(1.5):  # a header line well within --read-timeout, so never dropped
            for s in slow:
                s.sendall(b"X-Slow: 1\r\n")

    t = threading.Thread(target=trickle)
    t.start()
    try:
        time.sleep(0.5)
        for _ in range(3):
            t0 = time.monotonic()
            status, health = request(port, "GET", "/health", timeout=3)
            waited = time.monotonic() - t0
            assert status == 200 and health["status"] == "ok" and waited < 2, (status, health, waited)
        t0 = time.monotonic()
        status, r = request(port, "POST", "/v1/completions", COMPLETION, timeout=10)
        assert status == 200 and r["choices"][0]["text"] == " Paris.\n", (status, r)
        print(f"40 slow clients: /health answered, a completion in {time.monotonic() - t0:.2f} s")
    finally:
        stop.set()
        t.join()
        for s in slow:
            s.close()
    # A client that sends half a request line and then nothing is closed after 3 s.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/compl")
        t0 = time.monotonic()
        while s.recv(4096):
            pass
        closed = time.monotonic() - t0
        assert 2 < closed < 6, closed
        print(f"a silent client was dropped after {closed:.1f} s (--read-timeout 3)")

with server(args.build, args.model, "--threads", "1", "--slots", "1", "--api-key", "k3y", "--cors", "https://app.example",
            "--name", "served-model") as port:
    # A connection that sends nothing at all is closed after the HTTP library's wait for a
    # request (2 s, as between keep-alive requests), not after --read-timeout (10 s here).
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        t0 = time.monotonic()
        while s.recv(4096):
            pass
        closed = time.monotonic() - t0
        assert 1.5 < closed < 6, closed
        print(f"a connection that sent nothing was closed after {closed:.1f} s (--read-timeout 10)")
    for scheme in ["Bearer", "bearer", "BEARER"]:
        status, r = request(port, "GET", "/v1/models", headers={"Authorization": f"{scheme} k3y"})
        assert status == 200, (scheme, status, r)
    for auth in ["Bearerk3y", "Basic k3y", "bearer k3"]:
        status, r = request(port, "GET", "/v1/models", headers={"Authorization": auth})
        assert status == 401, (auth, status, r)

    def exchange(method, path, headers, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        conn.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}

    # A refusal sent before the body is read asks the client to close, so that a
    # keep-alive client's next request does not start inside the unread body.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for path in ["/v1/completions", "/v1/nowhere"]:
        conn.request("POST", path, body=json.dumps(dict(COMPLETION, prompt="x" * 5000)),
                     headers={"Authorization": "Bearer wrong", "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        assert r.status == 401 and r.getheader("Connection") == "close", (path, r.status, r.getheaders())
        conn.request("GET", "/health")  # http.client reopens the connection it was told to close
        r = conn.getresponse()
        health = json.loads(r.read())
        assert r.status == 200 and health["status"] == "ok", (path, r.status, health)
    conn.close()

    origin = {"Origin": "https://app.example"}
    status, h = exchange("OPTIONS", "/v1/chat/completions", dict(origin, **{"Access-Control-Request-Method": "POST"}))
    assert status == 204 and h.get("access-control-allow-origin") == "https://app.example", (status, h)
    assert "POST" in h["access-control-allow-methods"] and "Authorization" in h["access-control-allow-headers"], h
    status, h = exchange("GET", "/v1/models", origin)  # refused (no key), and the browser may read why
    assert status == 401 and h.get("access-control-allow-origin") == "https://app.example", (status, h)
    status, h = exchange("GET", "/health", {"Origin": "https://elsewhere.example"})
    assert status == 200 and "access-control-allow-origin" not in h, h

    auth = {"Authorization": "Bearer k3y"}
    ids = []
    for _ in range(2):
        status, r = request(port, "POST", "/v1/completions", dict(COMPLETION, model="gpt-4o"), headers=auth)
        assert status == 200 and r["model"] == "served-model", (status, r)
        assert re.fullmatch(r"cmpl-[0-9a-f]{32}", r["id"]), r["id"]
        ids.append(r["id"])
    assert ids[0] != ids[1], ids
    print(f"Bearer in any case, CORS, random ids ({ids[0]}), the model field not checked")

with server(args.build, args.model, "--threads", "1", "--slots", "1") as port:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("OPTIONS", "/v1/models")
    r = conn.getresponse()
    r.read()
    assert r.status == 204 and r.getheader("Access-Control-Allow-Origin") is None, (r.status, r.getheaders())
    # No key: a POST to a path no route has is answered 404 with its body unread.
    conn.request("POST", "/v1/nowhere", body="y" * 5000, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 404 and r.getheader("Connection") == "close", (r.status, r.getheaders())
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok", r.status
    conn.close()
    print("refusals with unread bodies close the connection; the next request is answered")

def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


if has_ipv6_loopback():
    with server_process(args.build, args.model, "--threads", "1", "--slots", "1", "--cors", "*", host="::1") as (port, _):
        conn = http.client.HTTPConnection("::1", port, timeout=30)
        conn.request("GET", "/health", headers={"Origin": "https://any.example"})
        r = conn.getresponse()
        health = json.loads(r.read())
        assert r.status == 200 and health["status"] == "ok" and r.getheader("Access-Control-Allow-Origin") == "*", health
        conn.close()
        print(f"--host ::1 printed as http://[::1]:{port}; --cors '*'")
else:
    print("no IPv6 loopback here: --host ::1 and --cors '*' not checked")

def listen_backlog(port):
    """The backlog of the TCP socket listening on `port`, as the kernel reports it through
    sock_diag (netlink): for a listening socket, inet_diag_msg's wqueue is the backlog."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4) as nl:  # NETLINK_SOCK_DIAG
        # inet_diag_req_v2: family, protocol, extensions, pad, states (1 << TCP_LISTEN), a zero sockid.
        req = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0, 1 << 10) + bytes(48)
        # nlmsghdr: length, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, port id.
        nl.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req)
        found = []
        while True:
            data = nl.recv(1 << 16)
            offset = 0
            while offset < len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == 3:  # NLMSG_DONE
                    return found[0] if len(found) == 1 else found
                assert kind == 20, f"sock_diag answered message type {kind}"
                body = offset + 16
                sport = struct.unpack_from("!H", data, body + 4)[0]
                rqueue, wqueue = struct.unpack_from("=II", data, body + 4 + 48 + 4)
                if sport == port:
                    found.append(wqueue)
                offset += (length + 3) & ~3


# --max-connections 2: two silent connections hold both threads, so /health waits until
# one of them closes.
with server(args.build, args.model, "--threads", "1", "--slots", "1", "--max-connections", "2") as port:
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    for s in held:
        s.sendall(b"GET /health HTTP/1.1\r\n")
    time.sleep(0.3)
    answers = {}
    waiting = threading.Thread(target=lambda: answers.update(health=request(port, "GET", "/health", timeout=20)))
    waiting.start()
    time.sleep(1)
    assert "health" not in answers, answers
    t0 = time.monotonic()
    held[0].close()
    waiting.join()
    assert answers["health"][0] == 200 and time.monotonic() - t0 < 3, answers
    held[1].close()
    assert listen_backlog(port) == 2, listen_backlog(port)
    print("--max-connections 2: a third connection waited for one to close; listen backlog 2")

# httplib listens with a backlog of 5; the server raises it to --max-connections (the
# kernel caps it at net.core.somaxconn). With 5, clients connecting at once had their SYNs
# dropped and retried, and one accepted late could be reset.
with open("/proc/sys/net/core/somaxconn") as f:
    somaxconn = int(f.read())
with server(args.build, args.model, "--threads", "1", "--slots", "1") as port:
    assert listen_backlog(port) == min(256, somaxconn), (listen_backlog(port), somaxconn)
    statuses = [None] * 64
    barrier = threading.Barrier(len(statuses))

    def health(i):
        barrier.wait()
        statuses[i] = request(port, "GET", "/health", timeout=60)[0]

    clients = [threading.Thread(target=health, args=(i,)) for i in range(len(statuses))]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    assert statuses == [200] * len(statuses), statuses
    print(f"listen backlog {min(256, somaxconn)}; 64 clients connecting at once all answered")


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
    return s, got


LONG = {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "stop": ["zzzzzz"]}
exe = os.path.join(args.build, "examples", "serve")
proc = subprocess.Popen([exe, "--model", args.model, "--port", "0", "--threads", "1", "--slots", "2", "--max-tokens", "3000"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
try:
    port = int(proc.stdout.readline().split("127.0.0.1:")[1].split()[0])
    s, got = open_stream(port, LONG)
    answers = {}

    def ask(name, body):
        answers[name] = request(port, "POST", "/v1/completions", body, timeout=60)

    running = threading.Thread(target=ask, args=("running", LONG))
    running.start()
    wait_until(lambda: request(port, "GET", "/health")[1]["busy"] == 2, 10, "both slots busy")
    queued = threading.Thread(target=ask, args=("queued", COMPLETION))
    queued.start()
    wait_until(lambda: request(port, "GET", "/health")[1]["queued"] == 1, 10, "a request queued")
    while got.count(b"data: ") < 3:  # the stream is under way: a cut, not a refusal
        got += s.recv(65536)
    t0 = time.monotonic()
    proc.terminate()
    while True:
        more = s.recv(65536)
        if not more:
            break
        got += more
        if got.endswith(b"0\r\n\r\n"):  # the chunked response's end
            break
    s.close()
    running.join()
    queued.join()
    assert proc.wait(timeout=30) == 0
    stopped = time.monotonic() - t0
    events = [e for e in got.decode().split("\r\n") if e.startswith("data: ")]
    last = json.loads(events[-1][len("data: "):])
    assert last["error"]["code"] == "server_shutting_down" and "cut short" in last["error"]["message"], events[-3:]
    assert b"[DONE]" not in got and b'"finish_reason":"stop"' not in got, events[-3:]
    for name in ["running", "queued"]:
        status, r = answers[name]
        assert status == 503 and r["error"]["code"] == "server_shutting_down", (name, status, r)
    print(f"SIGTERM: the stream ended, after {len(events) - 2} text events, with {last['error']['message']!r}; "
          f"running and queued requests 503; "
          f"exit 0 after {stopped:.2f} s")
finally:
    if proc.poll() is None:
        proc.kill()
print("check_connections: all passed")
