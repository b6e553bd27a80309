"""tlm.Llama against llama-cpp-python's Llama on the same file: the same greedy text, the
same prompt tokens, the same result shapes (completion, chat completion and their stream
chunks), the same context-window errors; what tlm lacks refused by name."""
import json
import os
import pathlib

import llama_cpp
import numpy as np
import pytest

import tlm

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = os.environ.get("TLM_MODEL_PATH", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Name a primary colour."}],
]


@pytest.fixture(scope="module")
def ours():
    return tlm.Llama(model_path=MODEL, n_ctx=512, n_threads=1, verbose=False)


# logits_all keeps every position's logits, which the near-tie check reads. n_batch=1:
# llama.cpp's prompt path for several tokens at a time took 7.6 s for 20 tokens on one
# thread of the 2-core EPYC (0.26 s a token at a time).
def llama_cpp_model(n_ctx, logits_all=True):
    return llama_cpp.Llama(model_path=MODEL, n_ctx=n_ctx, n_threads=1, n_batch=1, n_ubatch=1, verbose=False,
                           logits_all=logits_all)


@pytest.fixture(scope="module")
def theirs():
    return llama_cpp_model(512)


def shape(x):
    """The keys and value types of a result, recursively; ids and numbers by type only."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [shape(v) for v in x]
    return type(x).__name__


def same_until_a_near_tie(ours, theirs, prompt_ids, our_text, their_text):
    """Our greedy text and llama.cpp's are the same, or part where the two choices are
    closer than the two implementations' log-probabilities are to each other: the sum of
    the margins by which each side preferred its token is within the row's largest
    difference between tlm's and llama.cpp's log-softmax (llama.cpp runs int8 activations
    and an f16 cache; tlm's exact logits are checked against float64 elsewhere)."""
    if our_text == their_text:
        return
    ours_ids = ours.tokenize(our_text.encode(), add_bos=False)
    theirs_ids = ours.tokenize(their_text.encode(), add_bos=False)
    k = next((i for i in range(min(len(ours_ids), len(theirs_ids))) if ours_ids[i] != theirs_ids[i]), None)
    assert k is not None, (our_text, their_text)  # one is a prefix of the other: cut short, not parted
    context = list(prompt_ids) + ours_ids[:k]
    def log_softmax(row):
        row = np.asarray(row, dtype=np.float64)
        return row - row.max() - np.log(np.exp(row - row.max()).sum())
    mine = log_softmax(ours.model.logits(context)[-1])
    theirs.reset()
    theirs.eval(context)
    theirs_row = log_softmax(theirs.scores[len(context) - 1])
    a, b = ours_ids[k], theirs_ids[k]
    spread = np.abs(mine - theirs_row).max()
    assert spread < 1.5, f"tlm's and llama.cpp's log-probabilities differ by {spread} at the parting"
    assert (mine[a] - mine[b]) + (theirs_row[b] - theirs_row[a]) <= spread, (k, our_text, their_text)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_as_llama_cpp(ours, theirs, prompt):
    a = ours(prompt, max_tokens=32, temperature=0)
    b = theirs(prompt, max_tokens=32, temperature=0)
    ids = ours.tokenize(prompt.encode())
    assert ids == theirs.tokenize(prompt.encode())
    # tlm.Llama's text is tlm.Model's, exactly; llama.cpp's the same up to a near-tie.
    assert a["choices"][0]["text"] == ours.model.generate(ids, max_tokens=32)
    same_until_a_near_tie(ours, theirs, ids, a["choices"][0]["text"], b["choices"][0]["text"])
    if a["choices"][0]["text"] == b["choices"][0]["text"]:
        assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
        assert a["usage"] == b["usage"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] == len(ids)
    assert shape(a) == shape(b)
    assert a["object"] == "text_completion" and a["id"].startswith("cmpl-")


def test_prompt_as_ids_and_echo(ours, theirs):
    text = "The capital of France is"
    ids = theirs.tokenize(text.encode(), add_bos=True)
    assert ours.tokenize(text.encode(), add_bos=True) == ids
    a = ours.create_completion(ids, max_tokens=8, temperature=0)
    assert a["choices"][0]["text"] == ours(text, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == len(ids)
    # echo puts the prompt's text first (llama-cpp-python 0.3.36 fails on echo with ids)
    a = ours(text, max_tokens=8, temperature=0, echo=True)
    b = theirs(text, max_tokens=8, temperature=0, echo=True)
    assert a["choices"][0]["text"].startswith(text) and b["choices"][0]["text"].startswith(text)
    assert a["choices"][0]["text"] == text + ours(text, max_tokens=8, temperature=0)["choices"][0]["text"]


@pytest.mark.parametrize("messages", CHATS)
def test_greedy_chat_as_llama_cpp(ours, theirs, messages):
    a = ours.create_chat_completion(messages=messages, max_tokens=48, temperature=0)
    b = theirs.create_chat_completion(messages=messages, max_tokens=48, temperature=0)
    prompt = ours.model.chat_tokens(messages)
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] == len(prompt)
    assert a["choices"][0]["message"]["content"] == ours.model.chat(messages, max_tokens=48)
    same_until_a_near_tie(ours, theirs, prompt, a["choices"][0]["message"]["content"],
                          b["choices"][0]["message"]["content"])
    if a["choices"][0]["message"] == b["choices"][0]["message"]:
        assert a["usage"] == b["usage"] and a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
    assert a["choices"][0]["message"]["role"] == "assistant"
    assert shape(a) == shape(b)
    assert a["object"] == "chat.completion" and a["id"].startswith("chatcmpl-")


def test_streams_have_llama_cpp_chunks(ours, theirs):
    # Greedy on a prompt where tlm and llama.cpp write the same 24 tokens, so that the
    # chunks can be compared whole.
    prompt = "The best way to learn Python is"
    whole = ours(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
    a = list(ours(prompt, max_tokens=24, temperature=0, stream=True))
    b = list(theirs(prompt, max_tokens=24, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in a) == whole == "".join(c["choices"][0]["text"] for c in b)
    assert a[-1]["choices"][0]["finish_reason"] == b[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in a[:-1])
    assert shape(a[0]) == shape(b[0]) and shape(a[-1]) == shape(b[-1])
    assert len({c["id"] for c in a}) == 1

    chat = CHATS[1]  # one both answer alike, ending at the end-of-turn marker
    whole = ours.create_chat_completion(chat, max_tokens=48, temperature=0)["choices"][0]["message"]["content"]
    a = list(ours.create_chat_completion(chat, max_tokens=48, temperature=0, stream=True))
    b = list(theirs.create_chat_completion(chat, max_tokens=48, temperature=0, stream=True))
    assert a[0]["choices"][0]["delta"] == b[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert a[-1]["choices"][0]["delta"] == b[-1]["choices"][0]["delta"] == {}
    assert a[-1]["choices"][0]["finish_reason"] == b[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in a) == whole
    assert whole == "".join(c["choices"][0]["delta"].get("content", "") for c in b)
    assert [shape(c) for c in (a[0], a[1], a[-1])] == [shape(c) for c in (b[0], b[1], b[-1])]


def test_context_window_as_llama_cpp():
    # 256: llama.cpp rounds its window up to a multiple of 256 (n_ctx=64 gives 256); tlm
    # keeps the window asked for.
    assert llama_cpp_model(64, logits_all=False).n_ctx() == 256
    assert tlm.Llama(model_path=MODEL, n_ctx=64, verbose=False).n_ctx() == 64
    a = tlm.Llama(model_path=MODEL, n_ctx=256, n_threads=1, verbose=False)
    b = llama_cpp_model(256, logits_all=False)  # with logits_all, 0.3.36 fails on filling its window
    assert a.n_ctx() == b.n_ctx() == 256
    long = "one two three four five six seven eight nine ten " * 26
    # llama-cpp-python's own words (its check, llama.py's _create_completion); 0.3.36 with
    # n_batch=1 fails before it, with a numpy broadcast error.
    with pytest.raises(ValueError, match=r"^Requested tokens \(261\) exceed context window of 256$"):
        a(long, max_tokens=4)
    with pytest.raises(ValueError, match=r"^Requested tokens \(\d+\) exceed context window of 256$"):
        a.create_chat_completion([{"role": "user", "content": long}])
    # max_tokens None or 0, or past the window: up to the window, which ends it with "length"
    prompt = "one two three four five six seven eight nine ten " * 24
    ra = a(prompt, max_tokens=None, temperature=0)
    rb = b(prompt, max_tokens=None, temperature=0)
    assert ra["usage"] == rb["usage"] and ra["usage"]["total_tokens"] == 256
    assert ra["choices"][0]["finish_reason"] == rb["choices"][0]["finish_reason"] == "length"
    for max_tokens in (0, -1, 100):
        r = a(prompt, max_tokens=max_tokens, temperature=0)
        assert r["usage"] == ra["usage"] and r["choices"][0]["finish_reason"] == "length"


def test_seeds_reproduce(ours):
    runs = []
    for _ in range(2):
        llm = tlm.Llama(model_path=MODEL, n_ctx=256, n_threads=1, seed=7, verbose=False)
        runs.append([llm("Once upon a time", max_tokens=12, temperature=1.0)["choices"][0]["text"] for _ in range(2)])
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]  # each call draws its own seed from the Llama's
    a = ours("Once upon a time", max_tokens=12, temperature=1.0, seed=3)["choices"][0]["text"]
    assert a == ours("Once upon a time", max_tokens=12, temperature=1.0, seed=3)["choices"][0]["text"]


def test_tokens_and_text_as_llama_cpp(ours, theirs):
    text = "Hello <|im_start|> wörld 12345"
    for add_bos in (True, False):
        for special in (True, False):
            assert ours.tokenize(text.encode(), add_bos=add_bos, special=special) == \
                theirs.tokenize(text.encode(), add_bos=add_bos, special=special)
    ids = theirs.tokenize(text.encode(), add_bos=True, special=True)
    assert ours.detokenize(ids) == theirs.detokenize(ids)
    assert ours.detokenize(ids, special=True) == theirs.detokenize(ids, special=True)
    assert ours.detokenize(ids[3:], prev_tokens=ids[:3]) == theirs.detokenize(ids[3:], prev_tokens=ids[:3])
    assert (ours.n_ctx(), ours.n_vocab(), ours.token_eos(), ours.token_bos()) == \
        (theirs.n_ctx(), theirs.n_vocab(), theirs.token_eos(), theirs.token_bos())


def test_json_response_format(ours):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = ours.create_chat_completion(CHATS[0], max_tokens=64, temperature=0,
                                    response_format={"type": "json_object", "schema": schema})
    assert set(json.loads(r["choices"][0]["message"]["content"])) == {"city"}
    r = ours.create_chat_completion(CHATS[0], max_tokens=64, temperature=0, response_format={"type": "json_object"})
    json.loads(r["choices"][0]["message"]["content"])


def test_what_tlm_lacks_is_refused_by_name(ours):
    for kwargs, name in [({"typical_p": 0.5}, "typical_p"), ({"mirostat_mode": 2}, "mirostat_mode"),
                         ({"logprobs": 3}, "logprobs"), ({"suffix": "x"}, "suffix"), ({"tfs_z": 0.9}, "tfs_z")]:
        with pytest.raises(tlm.Error, match=f"tlm.Llama: {name} is not supported"):
            ours("Hi", max_tokens=2, **kwargs)
    with pytest.raises(tlm.Error, match="tlm.Llama: functions is not supported"):
        ours.create_chat_completion(CHATS[0], functions=[{"name": "f"}])
    with pytest.raises(tlm.Error, match="rope_freq_base is not supported"):
        tlm.Llama(model_path=MODEL, rope_freq_base=20000.0, verbose=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_ctxx'"):
        tlm.Llama(model_path=MODEL, n_ctxx=512)
    # Speed and device knobs are accepted, and change nothing.
    llm = tlm.Llama(model_path=MODEL, n_ctx=128, n_gpu_layers=-1, n_batch=64, use_mmap=True, flash_attn=True,
                    verbose=False)
    assert llm("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"] == \
        ours("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"]


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time"}}]
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def test_tool_calls_as_openai(ours):
    r = ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="required", temperature=0, max_tokens=64)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in ("get_weather", "now")
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert set(args) == {"city", "days"} and isinstance(args["city"], str) and isinstance(args["days"], int)
    # Named: that function; its prompt holds the tools' section (more tokens than without).
    r = ours.create_chat_completion(ASK, tools=WEATHER, tool_choice={"type": "function", "function": {"name": "now"}},
                                    temperature=0, max_tokens=64)
    assert r["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "now", "arguments": "{}"}
    assert r["usage"]["prompt_tokens"] == len(ours.model.chat_tokens(ASK, tools=WEATHER, tool_choice="now"))
    assert r["usage"]["prompt_tokens"] > len(ours.model.chat_tokens(ASK)) + 50
    # none: neither the section nor a call.
    r = ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="none", temperature=0, max_tokens=16)
    assert r["usage"]["prompt_tokens"] == len(ours.model.chat_tokens(ASK))
    assert r["choices"][0]["message"]["content"] is not None
    # Streamed: one tool_calls delta, the same call as without streaming.
    chunks = list(ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="required", temperature=0,
                                              max_tokens=64, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"} and deltas[-1] == {}
    assert not any("content" in d for d in deltas)
    [streamed] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert streamed[0]["function"] == call["function"] and streamed[0]["index"] == 0
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_several_tool_calls_in_one_reply(ours):
    # A newline (the separator between calls) favoured wherever the grammar allows one: the
    # reply goes on after each call while max_tokens has room; parallel_tool_calls=False
    # holds it to one call, as the server's field does.
    [newline] = ours.model.tokenize("\n")
    push = dict(tools=WEATHER, tool_choice="required", max_tokens=300, temperature=1.0, seed=7,
                logit_bias={newline: 100.0}, details=True)
    r = ours.model.chat(ASK, **push)
    assert r["finish_reason"] == "tool_calls"
    assert len(r["tool_calls"]) >= 2, r["text"]
    assert r["text"].count("</tool_call>\n<tool_call>\n") == len(r["tool_calls"]) - 1
    for c in r["tool_calls"]:
        assert c["name"] in ("get_weather", "now") and isinstance(json.loads(c["arguments"]), dict)
    one = ours.model.chat(ASK, parallel_tool_calls=False, **push)
    assert one["finish_reason"] == "tool_calls" and len(one["tool_calls"]) == 1, one["text"]
    # Through the llama-cpp-python API: the calls as OpenAI's list, streamed at their indexes.
    r = ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="required", max_tokens=300, temperature=1.0, seed=7,
                                    logit_bias={newline: 100.0})
    calls = r["choices"][0]["message"]["tool_calls"]
    assert len(calls) >= 2 and r["choices"][0]["finish_reason"] == "tool_calls"
    chunks = list(ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="required", max_tokens=300,
                                              temperature=1.0, seed=7, logit_bias={newline: 100.0}, stream=True))
    [streamed] = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert [d["index"] for d in streamed] == list(range(len(calls)))
    assert [d["function"] for d in streamed] == [c["function"] for c in calls]


def test_tool_history_in_the_hermes_form(ours):
    # A call and its result go back into the conversation as Qwen2.5's template writes them.
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 22 C"},
        {"role": "tool", "tool_call_id": "call_1", "content": "then rain"}]
    ids = ours.model.chat_tokens(history, tools=WEATHER)
    text = ours.model.detokenize(ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 22 C\n</tool_response>\n<tool_response>\nthen rain\n</tool_response>" in text
    r = ours.create_chat_completion(history, tools=WEATHER, temperature=0, max_tokens=64)
    assert r["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    with pytest.raises(tlm.Error, match="^chat: 'tool_choice' names the function 'delete', which 'tools' does not hold"):
        ours.create_chat_completion(ASK, tools=WEATHER, tool_choice="delete")
    with pytest.raises(tlm.Error, match="json_schema and tools"):
        ours.create_chat_completion(ASK, tools=WEATHER, response_format={"type": "json_object"})
    # The server's rule and words for a tool (tools.hpp's read_tools), with chat's prefix.
    with pytest.raises(tlm.Error, match=r"^chat: 'tools\[0\]\.function\.name' must be 1 to 64 letters, digits"):
        ours.model.chat(ASK, tools=[{"type": "function", "function": {"name": "bad name"}}])
