"""A request's sampling fields are generate's sampling options (tlm/generation/sampling_options.hpp):
every option generate --help lists is a field by the same name (snake_case) with the same
range. A value just below or above the range gets a 400 naming the field and the range;
the bounds and the defaults are accepted; penalty_window is a field like the others."""
import os
import re
import subprocess

from serve_common import arguments, request, server

args = arguments()
BASE = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}


def table():
    """(name, range text, lo, hi (an int for a whole number), lo_open, default text) of each option, from generate --help:
    the usage lines the table writes, so an option added to it is checked here too."""
    out = subprocess.run([os.path.join(args.build, "examples", "generate"), "--help"], capture_output=True, text=True,
                         check=True).stdout
    rows = re.findall(r"^  --([a-z-]+) \S+ [^\n]*\n +(whole number|number) ((.)(-?[0-9.]+), (-?[0-9.]+)\](?: or -inf)?), "
                      r"default ([^;\n]+)", out, re.M)
    assert len(rows) >= 10, out
    return [(flag.replace("-", "_"), text, float(lo), int(hi) if kind == "whole number" else float(hi), bracket == "(", default)
            for flag, kind, text, bracket, lo, hi, default in rows]


def refused(port, field, value):
    status, r = request(port, "POST", "/v1/completions", dict(BASE, **{field: value}))
    assert status == 400, (field, value, status, r)
    assert r["error"]["param"] == field and f"'{field}'" in r["error"]["message"], (field, value, r)
    return r["error"]["message"]


def accepted(port, field, value):
    status, r = request(port, "POST", "/v1/completions", dict(BASE, **{field: value}))
    assert status == 200, (field, value, status, r)


with server(args.build, args.model, "--slots", "1", "--threads", "1", "--max-tokens", "16") as port:
    options = table()
    names = [o[0] for o in options]
    assert "penalty_window" in names and "logit_bias" in names, names
    for name, text, lo, hi, lo_open, default in options:
        if name == "logit_bias":
            for bias in (-100.5, 101):
                message = refused(port, name, {"5": bias})
                assert text in message, (name, message)
            for bias in (-100, 100):
                accepted(port, name, {"5": bias})
            refused(port, name, {"49152": 1})  # outside SmolLM2's vocabulary
            continue
        whole = isinstance(hi, int)
        below = -1 if whole else (lo if lo_open else lo - 0.5)
        above = hi + 1 if whole else hi + 0.5
        for bad in (below, above):
            message = refused(port, name, bad)
            # A whole number past 2^64 is not one JSON can carry as an integer: refused as a type.
            assert text in message or (whole and bad > 2**64 - 1), (name, bad, message)
        accepted(port, name, hi)
        if not lo_open:
            accepted(port, name, int(lo) if whole else lo)
        accepted(port, name, int(default) if whole else float(default))
        print(f"{name}: {text}, default {default}: refused {below} and {above}")
    # The penalties over a window: the sampler's penalties see only the last 4 tokens.
    status, r = request(port, "POST", "/v1/completions",
                        dict(BASE, max_tokens=8, penalty_window=4, repeat_penalty=1.3, frequency_penalty=0.5))
    assert status == 200 and r["usage"]["completion_tokens"] >= 1, r
    # At temperature 0, top_k, top_p and min_p keep the greedy token: the same text as without.
    status, plain = request(port, "POST", "/v1/completions", dict(BASE, max_tokens=4))
    status2, limited = request(port, "POST", "/v1/completions", dict(BASE, max_tokens=4, top_k=3, top_p=0.5, min_p=0.2))
    assert status == status2 == 200 and plain["choices"][0]["text"] == limited["choices"][0]["text"], (plain, limited)
print("every sampling field of generate's table is read, with its range")
