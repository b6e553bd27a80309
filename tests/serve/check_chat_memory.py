"""Chat sizing and memory. A message holding "<|im_end|>" as text (ten times) is
answered, streamed or not: the server counts a conversation with the chat session's own
tokenization (the string is text there, seven tokens, not one special token), so it
neither refuses a conversation that fits nor sends 200 and then an error event; one that
does not fit is a 400 that names --ctx, before any stream starts. And the resident
memory after 50 chat requests (max_tokens 1000, each ended at once by a logit_bias on
<|im_end|>) is within a bound of that after 10: a slot reuses its KV cache."""
from serve_common import arguments, request, rss_mib, server_process, stream_text

args = arguments()
IM_END = 2  # SmolLM2's <|im_end|>

with server_process(args.build, args.model, "--slots", "1", "--threads", "1", "--ctx", "512", "--max-tokens", "64") as (port, _):
    marked = {"messages": [{"role": "user", "content": "Repeat: " + "<|im_end|>" * 10}], "max_tokens": 8, "temperature": 0}
    status, r = request(port, "POST", "/v1/chat/completions", marked)
    assert status == 200 and r["choices"][0]["finish_reason"] in ("stop", "length"), (status, r)
    prompt_tokens = r["usage"]["prompt_tokens"]
    assert prompt_tokens > 70, r["usage"]  # each marker is text: several tokens, not one
    text, finish, _ = stream_text(port, "/v1/chat/completions", marked)
    assert text == r["choices"][0]["message"]["content"] and finish == r["choices"][0]["finish_reason"], (text, finish)
    too_long = {"messages": [{"role": "user", "content": "<|im_end|>" * 80}], "max_tokens": 8}
    for stream in (False, True):
        status, r = request(port, "POST", "/v1/chat/completions", dict(too_long, stream=stream))
        assert status == 400 and r["error"]["code"] == "context_length_exceeded", (stream, status, r)
        message = r["error"]["message"]
        assert "--ctx" in message and "reset()" not in message and "chat_options" not in message, message
    print(f"ten <|im_end|> as text: {prompt_tokens} prompt tokens, answered; 80 of them: 400 ({message!r})")

with server_process(args.build, args.model, "--slots", "1", "--threads", "1") as (port, proc):
    body = {"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 1000, "temperature": 0,
            "logit_bias": {str(IM_END): 100}}
    rss = {}
    for i in range(1, 51):
        status, r = request(port, "POST", "/v1/chat/completions", body)
        assert status == 200 and r["usage"]["completion_tokens"] == 0, (status, r)
        if i in (10, 50):
            rss[i] = rss_mib(proc.pid)
    grown = rss[50] - rss[10]
    assert grown < 20, f"RSS grew by {grown:.0f} MiB from request 10 ({rss[10]:.0f} MiB) to request 50 ({rss[50]:.0f} MiB)"
    print(f"RSS after 10 chat requests {rss[10]:.0f} MiB, after 50 {rss[50]:.0f} MiB")
print("check_chat_memory: all passed")
