"""POST /v1/embeddings against the float64 reference: each text's final hidden states
(after the output norm), pooled and scaled to unit length by tests/reference/ref_forward.py
from the file's dequantized weights, equal the server's within 1e-5 relative (max |ours -
ref| / max |ref|), for mean and last pooling, for texts given as strings (tokenized by
Hugging Face's tokenizer here, by tlm's there) and as token ids, one per request and many
per request, with float and base64 encodings, through plain HTTP and the official openai
client. Then what the endpoint refuses, each with 400 and the reason, and its count in
/metrics."""
import base64
import json
import os
import socket
import sys

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

from ref_forward import RefModel  # noqa: E402
from tokenizer_common import build_hf_tokenizer, hf_encode  # noqa: E402
from serve_common import arguments, request, server, wait_until  # noqa: E402

args = arguments()
BOUND = 1e-5
DIM = 576

TEXTS = [
    "The capital of France is Paris.",
    "A haiku about the sea: waves fold into foam, the gulls argue with the wind, salt on every stone.",
    # Longer than the --prefill-chunk the servers run with, so it is pooled over several chunks.
    " ".join(["Photosynthesis is the process by which plants turn light, water and carbon dioxide into sugar."] * 4),
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
]

hf, _ = build_hf_tokenizer(args.model)
ids = [hf_encode(hf, t, parse_special=False) for t in TEXTS]
assert len(ids[2]) > 40, len(ids[2])
ref = RefModel(args.model)
want = {p: [ref.embedding(i, p) for i in ids] for p in ("mean", "last")}


def rel(got, ref_vec):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref_vec.shape, (got.shape, ref_vec.shape)
    return float(np.max(np.abs(got - ref_vec)) / np.max(np.abs(ref_vec)))


def embed(port, body):
    status, r = request(port, "POST", "/v1/embeddings", body)
    assert status == 200, (status, r)
    assert r["object"] == "list" and r["model"] == "SmolLM2-135M-Instruct.Q4_1", r
    assert [d["index"] for d in r["data"]] == list(range(len(r["data"]))), r["data"]
    assert all(d["object"] == "embedding" for d in r["data"])
    return r


worst = {}
for pooling in ("mean", "last"):
    with server(args.build, args.model, "--parallel", "2", "--threads", "1", "--prefill-chunk", "16",
                "--pooling", pooling) as port:
        # One text per request, as a string and as token ids.
        for t, i, w in zip(TEXTS, ids, want[pooling]):
            r = embed(port, {"model": "any", "input": t})
            assert r["pooling"] == pooling, r["pooling"]
            assert r["usage"] == {"prompt_tokens": len(i), "total_tokens": len(i)}, (t, r["usage"], len(i))
            e = r["data"][0]["embedding"]
            assert len(e) == DIM
            assert abs(np.linalg.norm(e) - 1) < 1e-6, np.linalg.norm(e)
            err = rel(e, w)
            assert err <= BOUND, f"{pooling} {t[:30]!r}: {err:.3g} from the float64 reference"
            worst[pooling] = max(worst.get(pooling, 0), err)
            r = embed(port, {"input": i})
            assert rel(r["data"][0]["embedding"], w) <= BOUND
        # All texts in one request (they run two at a time, interleaved), mixed forms, base64.
        mixed = [TEXTS[0], ids[1], TEXTS[2], ids[3]]
        r = embed(port, {"input": mixed, "encoding_format": "base64"})
        assert r["usage"]["prompt_tokens"] == sum(len(i) for i in ids), r["usage"]
        for d, w in zip(r["data"], want[pooling]):
            e = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
            assert rel(e, w) <= BOUND, (d["index"], rel(e, w))
        # The official client (it asks for base64 and decodes it itself).
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        out = client.embeddings.create(model="tlm", input=TEXTS)
        assert [d.index for d in out.data] == [0, 1, 2, 3]
        for d, w in zip(out.data, want[pooling]):
            assert rel(d.embedding, w) <= BOUND
        assert out.usage.prompt_tokens == sum(len(i) for i in ids)
        # More texts than sequences and queue places together: they take turns.
        many = [TEXTS[k % 4] for k in range(40)]
        r = embed(port, {"input": many})
        for k, d in enumerate(r["data"]):
            assert rel(d["embedding"], want[pooling][k % 4]) <= BOUND, k

        if pooling == "mean":
            # Refusals, each with the field and the reason.
            for body, status, part in [
                ({}, 400, "'input' is required"),
                ({"input": ""}, 400, "'input[0]' is empty"),
                ({"input": []}, 400, "'input' must be a non-empty"),
                ({"input": [[]]}, 400, "'input[0]' is empty"),
                ({"input": ["fine", 3]}, 400, "'input[1]' must be a string or an array of token ids"),
                ({"input": [1, 2, 49152]}, 400, "49152, which is not a token id of this model (0 to 49151)"),
                ({"input": [1, -1]}, 400, "not a token id"),
                ({"input": "x", "dimensions": 256}, 400, "this model's embeddings have 576"),
                ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
                ({"input": ["x"] * 2049}, 400, "at most 2048"),
                ({"input": [7] * 4097}, 400, "has 4097 tokens; this server takes at most 4096 per text (--ctx)"),
                ({"input": "x", "model": 5}, 400, "'model' must be a string"),
            ]:
                got_status, r = request(port, "POST", "/v1/embeddings", body)
                assert got_status == status, (body if len(str(body)) < 200 else str(body)[:200], got_status, r)
                assert part in r["error"]["message"], (part, r["error"]["message"])
            got_status, r = request(port, "POST", "/v1/embeddings", b"{not json", {"Content-Type": "application/json"})
            assert got_status == 400 and "not valid JSON" in r["error"]["message"], r
            # A client that leaves in the middle of 2048 texts frees both sequences at their
            # next step, and the server answers the next request.
            body = json.dumps({"input": [TEXTS[2]] * 2048}).encode()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            wait_until(lambda: any(x["state"] == "embedding" for x in request(port, "GET", "/slots")[1]), 30,
                       "the 2048 texts to start")
            sock.close()
            wait_until(lambda: all(x["state"] == "idle" for x in request(port, "GET", "/slots")[1]), 10,
                       "the sequences to be freed after the client left")
            # Explicit dimensions equal to the model's are fine.
            assert rel(embed(port, {"input": TEXTS[0], "dimensions": DIM})["data"][0]["embedding"], want["mean"][0]) <= BOUND
            # A generation between embeddings runs as usual, and the counts show the endpoint.
            status, r = request(port, "POST", "/v1/completions", {"prompt": TEXTS[0], "max_tokens": 4, "temperature": 0})
            assert status == 200, r
            status, text = request(port, "GET", "/metrics")
            assert status == 200
            ok = [ln for ln in text.splitlines() if ln.startswith('tlm_requests_total{endpoint="/v1/embeddings",status="200"}')]
            assert ok and int(ok[0].split()[-1]) == 2 * len(TEXTS) + 3 + 1, ok
            left = [ln for ln in text.splitlines() if ln.startswith('tlm_requests_total{endpoint="/v1/embeddings",status="499"}')]
            assert left and int(left[0].split()[-1]) == 1, left
            bad = [ln for ln in text.splitlines() if ln.startswith('tlm_requests_total{endpoint="/v1/embeddings",status="400"}')]
            assert bad and int(bad[0].split()[-1]) == 13, bad

# Mean and last pooling differ: the check above would not notice a server that ignores --pooling otherwise.
assert rel(want["last"][0], want["mean"][0]) > 1e-2
print(f"embeddings: {len(TEXTS)} texts, mean and last pooling, strings, ids, batches of 4 and 40, float and base64, "
      f"openai client; worst error against float64: mean {worst['mean']:.2e}, last {worst['last']:.2e} (bound {BOUND})")
