"""Requests the server must refuse cheaply, with a 4xx, and survive (each was a crash or
a cost out of proportion before): a response_format schema nested 20,000 levels deep and
an unsupported key nested 120,000 levels (a stack overflow), a schema too deep or too big
for tlm (refused before it is compiled, in milliseconds), chunked and length-less bodies
over --max-body (413 at the limit, not read whole), a Content-Length over it (413), a
chunked body to a path with no endpoint (404, not read). A JSON
body sent with curl's default form Content-Type is read as JSON; multipart is refused."""
import json
import select
import socket
import time

from serve_common import arguments, request, server

args = arguments()
GOOD = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}


def timed(port, body, **kw):
    t0 = time.monotonic()
    status, r = request(port, "POST", "/v1/completions", body, {"Content-Type": "application/json"}, timeout=30, **kw)
    return status, r, (time.monotonic() - t0) * 1000


def with_schema(schema_text):
    return (b'{"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {"schema": '
            + schema_text + b"}}}")


def streamed_body(port, head, chunked, limit_bytes=8 << 20):
    """Sends a body of '{"prompt": "aaa...' in 64 KiB pieces until the server answers or
    limit_bytes are sent; returns (the status line, bytes sent). The server must answer
    without waiting for the rest (or for the client to close)."""
    piece = b"a" * 65536
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        sent = 0
        first = b'{"prompt": "'
        while sent < limit_bytes:
            data = first + piece
            first = b""
            s.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            sent += len(data)
            if select.select([s], [], [], 0.01)[0]:
                break
        # Whatever was sent, an answer must come within a few seconds without a close.
        ready = select.select([s], [], [], 5)[0]
        assert ready, f"no answer after {sent} bytes of a {'chunked' if chunked else 'length-less'} body"
        answer = s.recv(65536)
        while b"}}" not in answer and select.select([s], [], [], 2)[0]:  # the body may come in a later segment
            more = s.recv(65536)
            if not more:
                break
            answer += more
        return answer.split(b"\r\n", 1)[0].decode(), sent, answer


with server(args.build, args.model, "--slots", "1", "--threads", "1", "--max-tokens", "16") as port:
    # A schema 20,000 arrays deep (~500 KB, under the default --max-body of 1 MiB).
    deep = b'{"type":"array","items":' * 20000 + b'{"type":"string"}' + b"}" * 20000
    status, r, ms = timed(port, with_schema(deep))
    assert status == 400 and "deep" in r["error"]["message"] and ms < 1000, (status, r, ms)
    print(f"schema nested 20,000 levels: 400 in {ms:.1f} ms: {r['error']['message']}")
    # An unsupported key holding 120,000 nested arrays (240 KB).
    status, r, ms = timed(port, with_schema(b'{"type":"string","x":' + b"[" * 120000 + b"]" * 120000 + b"}"))
    assert status == 400 and "deep" in r["error"]["message"] and ms < 1000, (status, r, ms)
    print(f"key nested 120,000 levels: 400 in {ms:.1f} ms")
    # Nested "properties", 4,000 deep (216 KB): cost 10 s of compile before its 400.
    chain = b'{"type":"object","required":["a"],"properties":{"a":' * 4000 + b'{"type":"string"}' + b"}}" * 4000
    status, r, ms = timed(port, with_schema(chain))
    assert status == 400 and ms < 1000, (status, r, ms)
    print(f"properties nested 4,000 deep: 400 in {ms:.1f} ms")
    # Within the body's nesting limit but deeper than a schema may be: refused by the
    # schema's own check (json_schema::check_limits), before it is compiled.
    status, r, ms = timed(port, with_schema(b'{"type":"array","items":' * 40 + b'{"type":"string"}' + b"}" * 40))
    assert status == 400 and r["error"]["param"] == "response_format" and "more than 32" in r["error"]["message"], (status, r)
    # Flat but big: 800 properties are 1,600 values, over the 1,024 a schema may have.
    props = {f"p{i}": {"type": "string"} for i in range(800)}
    big = json.dumps({"type": "object", "properties": props, "required": list(props)}).encode()
    status, r, ms = timed(port, with_schema(big))
    assert status == 400 and "1024 JSON values" in r["error"]["message"] and ms < 1000, (status, r, ms)
    print(f"a schema of 1,600 values: 400 in {ms:.1f} ms")
    # A schema within the limits still works.
    ok = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    status, r, _ = timed(port, dict(GOOD, max_tokens=16, response_format={"type": "json_schema", "json_schema": {"schema": ok}}))
    assert status == 200 and r["choices"][0]["text"].startswith('{"city":'), (status, r)

    # curl -d sends application/x-www-form-urlencoded; 20 KB of it was refused as "larger
    # than --max-body" by httplib's 8 KiB form limit. It is read as the JSON it is.
    padded = json.dumps(GOOD).encode() + b" " * 20000
    status, r = request(port, "POST", "/v1/completions", padded, {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and r["choices"][0]["text"] == " Paris.\n", (status, r)
    status, r = request(port, "POST", "/v1/completions", b"--x\r\n\r\n--x--\r\n",
                        {"Content-Type": "multipart/form-data; boundary=x"})
    assert status == 415 and "application/json" in r["error"]["message"], (status, r)
    status, r = request(port, "GET", "/health")
    assert status == 200 and r["status"] == "ok", r

with server(args.build, args.model, "--slots", "1", "--threads", "1", "--max-tokens", "8", "--max-body", "100000") as port:
    # Chunked: answered 413 once past the limit, not after reading 8 MiB.
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    line, sent, answer = streamed_body(port, head, chunked=True)
    assert line.endswith("413 Payload Too Large") and b"100000 bytes (--max-body)" in answer and sent < 1 << 20, (line, sent)
    print(f"chunked body: {line!r} after {sent} bytes sent")
    # No Content-Length and not chunked: the body runs to the end of the connection, so
    # without a limit while reading, the server waited for a close that never came.
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
    line, sent, answer = streamed_body(port, head, chunked=False)
    assert line.endswith("413 Payload Too Large") and sent < 1 << 20, (line, sent)
    print(f"length-less body: {line!r} after {sent} bytes sent")
    # A path with no endpoint: 404 without reading the body (httplib read it whole).
    for method in [b"POST", b"PUT", b"DELETE"]:
        head = method + b" /v1/nothing HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        line, sent, answer = streamed_body(port, head, chunked=True)
        assert line.endswith("404 Not Found") and b'"code":"not_found"' in answer and sent < 1 << 20, (method, line, sent)
    status, r = request(port, "POST", "/v1/completions", json.dumps(GOOD).encode() + b" " * 200000)
    assert status == 413 and r["error"]["code"] == "request_too_large", (status, r)
    status, r = request(port, "POST", "/v1/completions", GOOD)
    assert status == 200 and r["choices"][0]["text"] == " Paris.\n", (status, r)
print("check_limits: all passed")
