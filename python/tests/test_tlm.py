"""The Python module against the C++ programs built from the same headers: the same
ids, the same logits (bit for bit), the same text; errors as tlm.Error; streaming equal
to non-streaming; the GIL released while the model runs, or waits for it; Ctrl-C heard
during a generation."""
import _thread
import json
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import tlm

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = os.environ.get("TLM_MODEL_PATH", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
EXAMPLES = pathlib.Path(os.environ.get("TLM_EXAMPLES", str(ROOT / "build" / "examples")))
TINY = ROOT / "tests" / "fixtures" / "gguf" / "tiny.gguf"


@pytest.fixture(scope="module")
def model():
    return tlm.Model(MODEL, config="smollm2_135m", threads=1)


def run(program, *args):
    return subprocess.run([str(EXAMPLES / program), "--model", MODEL, *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.mark.parametrize("text", ["The capital of France is", "héllo wörld 12345!\n\tdef f(x): return x**2",
                                  "<|im_start|>user\nHi<|im_end|>"])
def test_tokenize_equals_cpp(model, text):
    lines = run("tokenize", "--special", text).splitlines()
    want = [int(line.split("\t")[0]) for line in lines[1:]]
    assert lines[0] == f"{len(want)} tokens"
    assert model.tokenize(text, special=True) == want
    assert model.detokenize(want) == text


def test_special_markers_are_text_by_default(model):
    assert len(model.tokenize("<|im_start|>")) > 1
    assert model.tokenize("<|im_start|>", special=True) == [1]


def test_special_ids_come_from_the_file(model):
    # SmolLM2-135M-Instruct: BOS <|im_start|> (1), EOS <|im_end|> (2); <|endoftext|> (0)
    # also ends a reply, so a loop stopping at eos alone would run past it.
    assert (model.bos, model.eos) == (1, 2)
    assert model.end_of_generation == [0, 2]
    assert model.detokenize([0]) == "<|endoftext|>"


@pytest.mark.parametrize("prompt,n", [("The capital of France is", 16), ("def fibonacci(n):", 24)])
def test_generate_equals_cpp(model, prompt, n):
    # generate --print-ids prints the prompt and continuation, a newline, the ids and a newline.
    out = run("generate", "--threads", "1", "--print-ids", "-n", str(n), prompt)
    printed, ids_line = out[:-1].rsplit("\n", 1)
    want_text = printed[len(prompt):]
    want_ids = [int(i) for i in ids_line.split(",")]
    r = model.generate(prompt, max_tokens=n, details=True)
    assert r["ids"] == want_ids
    assert r["text"] == want_text
    assert r["prompt_tokens"] == len(model.tokenize(prompt))
    assert model.generate(prompt, max_tokens=n) == want_text
    assert model.generate(model.tokenize(prompt), max_tokens=n) == want_text


def test_sampled_generate_equals_cpp(model):
    prompt = "Once upon a time"
    printed = run("generate", "--threads", "1", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "7",
                  "-n", "24", prompt)[:-1]
    got = model.generate(prompt, max_tokens=24, temperature=0.8, top_k=40, top_p=0.9, seed=7)
    assert got == printed[len(prompt):]
    assert got != model.generate(prompt, max_tokens=24, temperature=0.8, top_k=40, top_p=0.9, seed=8)


def test_logits_equal_cpp_bit_for_bit(model, tmp_path):
    ids = model.tokenize("The quick brown fox jumps over the lazy dog")
    dump = tmp_path / "logits.f32"
    run("generate", "--threads", "1", "--token-ids", ",".join(map(str, ids)), "-n", "1", "--dump-logits", str(dump))
    want = np.fromfile(dump, dtype=np.float32).reshape(len(ids), model.vocab_size)
    got = model.logits(ids)
    assert got.dtype == np.float32 and got.shape == (len(ids), 49152)
    assert np.array_equal(got, want)
    assert int(got[-1].argmax()) == model.generate(ids, max_tokens=1, details=True)["ids"][0]


def test_logits_are_not_copied(model):
    a = model.logits([1, 2, 3])
    # The array views the C++ vector (kept alive by a capsule) instead of owning a copy.
    assert not a.flags["OWNDATA"] and a.base is not None
    assert a.flags["C_CONTIGUOUS"]


def test_embed_equals_the_float64_reference(model):
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    from ref_forward import RefModel

    ref = RefModel(MODEL)
    texts = ["The capital of France is Paris.", "def f(x):\n    return x ** 2  # héllo"]
    ids = [model.tokenize(t) for t in texts]
    for pooling in ("mean", "last"):
        for t, i in zip(texts, ids):
            e = model.embed(t, pooling=pooling)
            assert e.dtype == np.float32 and e.shape == (576,)
            assert abs(float(np.linalg.norm(e.astype(np.float64))) - 1) < 1e-6
            want = ref.embedding(i, pooling)
            assert np.max(np.abs(e - want)) / np.max(np.abs(want)) <= 1e-5
            assert np.array_equal(model.embed(i, pooling=pooling), e)  # ids or text: the same run
    both = model.embed([texts[0], ids[1]])
    assert both.shape == (2, 576)
    assert np.array_equal(both[0], model.embed(texts[0])) and np.array_equal(both[1], model.embed(texts[1]))
    with pytest.raises(tlm.Error, match="pooling is 'max'; give 'mean' or 'last'"):
        model.embed("x", pooling="max")
    with pytest.raises(tlm.Error, match="the text is empty"):
        model.embed("")
    with pytest.raises(tlm.Error, match="outside the vocabulary"):
        model.embed([1, 49152])
    with pytest.raises(tlm.Error, match="input 1 is neither a str nor a list of token ids"):
        model.embed(["fine", 3.5])


def test_chat_equals_cpp(model):
    question = "What is the capital of France?"
    printed = run("generate", "--threads", "1", "--chat", "-n", "30", question)[:-1]
    want = printed.split("<|im_start|>assistant\n", 1)[1]
    assert model.chat([{"role": "user", "content": question}], max_tokens=30) == want == "The capital of France is Paris."
    # OpenAI's list-of-parts content reads the same.
    assert model.chat([{"role": "user", "content": [{"type": "text", "text": question}]}], max_tokens=30) == want


def test_chat_template_by_name_equals_cpp(model):
    question = "What is the capital of France?"
    printed = run("generate", "--threads", "1", "--chat", "--chat-template", "zephyr", "-n", "12", question)[:-1]
    want = printed.split("<|assistant|>\n", 1)[1]
    assert model.chat([{"role": "user", "content": question}], max_tokens=12, chat_template="zephyr") == want
    with pytest.raises(tlm.Error, match=r"--chat-template vicuna: no such chat template; the names are chatml, smollm2"):
        model.chat([{"role": "user", "content": question}], chat_template="vicuna")


def test_chat_with_history_and_system(model):
    messages = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Capital of Italy?"}]
    first = model.chat(messages, max_tokens=10, details=True)
    assert first["text"] and first["finish_reason"] in ("eos", "length")
    messages += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "And of Spain?"}]
    assert model.chat(messages, max_tokens=10)


@pytest.mark.parametrize("kwargs", [dict(), dict(temperature=0.9, top_p=0.95, seed=3), dict(stop=["\n"])])
def test_stream_equals_non_stream(model, kwargs):
    prompt = "Write a short poem about the sea:"
    whole = model.generate(prompt, max_tokens=40, **kwargs)
    pieces = list(model.generate(prompt, max_tokens=40, stream=True, **kwargs))
    assert "".join(pieces) == whole
    assert len(pieces) > 1 or "stop" in kwargs
    chat = [{"role": "user", "content": prompt}]
    assert "".join(model.chat(chat, max_tokens=30, stream=True, **kwargs)) == model.chat(chat, max_tokens=30, **kwargs)


def test_dropping_a_stream_stops_it(model):
    stream = model.generate("Once upon a time", max_tokens=4000, stream=True, ignore_eos=True)
    assert next(stream)
    t0 = time.monotonic()
    del stream
    # The model is free again at once, not after 4000 tokens.
    assert model.generate("The capital of France is", max_tokens=2) == " Paris."
    assert time.monotonic() - t0 < 10


def test_dropping_a_waiting_stream_lets_go_of_the_gil(model):
    first = model.generate("Once upon a time", max_tokens=150, ignore_eos=True, stream=True)
    assert next(first)
    # The second stream's thread waits for the model, which the first holds for seconds.
    second = model.generate("The history of Rome", max_tokens=8, stream=True)
    count, done = [0], threading.Event()

    def counter():
        while not done.is_set():
            count[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=counter)
    t.start()
    time.sleep(0.05)
    before, t0 = count[0], time.monotonic()
    del second
    elapsed, during = time.monotonic() - t0, count[0] - before
    time.sleep(0.05)
    after = count[0] - before
    done.set()
    t.join()
    # Dropped at once, not when the first stream ends (3.9 s, the counter stopped).
    assert elapsed < 1.0, (elapsed, during)
    assert after > 10, after
    del first


@pytest.mark.parametrize("call", ["generate", "chat"])
def test_ctrl_c_stops_a_long_generation(model, call):
    def long_call():
        if call == "generate":
            return model.generate("Once upon a time", max_tokens=400, ignore_eos=True)
        return model.chat([{"role": "user", "content": "Count from 1 to 500, separated by commas."}], max_tokens=400)

    timer = threading.Timer(0.5, _thread.interrupt_main)  # Ctrl-C, as the terminal sends it
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        long_call()
        time.sleep(5)  # reached only if the interrupt was missed: fail rather than raise later
    elapsed = time.monotonic() - t0
    timer.join()
    assert 0.5 <= elapsed < 1.0, elapsed
    assert model.generate("The capital of France is", max_tokens=2) == " Paris."


def test_ctrl_c_stops_a_wait_for_a_stream(model):
    first = model.generate("Once upon a time", max_tokens=150, ignore_eos=True, stream=True)
    assert next(first)
    second = model.generate("The history of Rome", max_tokens=8, stream=True)  # waits for the model
    timer = threading.Timer(0.5, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(second)
        time.sleep(5)  # reached only if the interrupt was missed
    elapsed = time.monotonic() - t0
    timer.join()
    assert 0.5 <= elapsed < 1.0, elapsed
    del first, second
    assert model.generate("The capital of France is", max_tokens=2) == " Paris."


def test_seed_is_random_unless_given(model):
    prompt, kwargs = "Once upon a time", dict(max_tokens=10, temperature=1.0)
    # Three calls without a seed: the same text three times is (about) impossible.
    assert len({model.generate(prompt, ignore_eos=True, **kwargs) for _ in range(3)}) > 1
    for seed in (0, 11):  # 0 is a seed like any other
        assert model.generate(prompt, seed=seed, **kwargs) == model.generate(prompt, seed=seed, **kwargs)
    chat = [{"role": "user", "content": "Say something."}]
    assert model.chat(chat, seed=4, **kwargs) == model.chat(chat, seed=4, **kwargs)


def test_chat_roles_and_message_sequences(model):
    with pytest.raises(tlm.Error, match=r"messages\[1\] has role 'wizard'; the chat template knows system, user, "
                                        r"assistant and tool"):
        model.chat([{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "Abracadabra"}])
    question = {"role": "user", "content": "What is the capital of France?"}
    assert model.chat((question,), max_tokens=10) == model.chat([question], max_tokens=10) == "The capital of France is Paris."
    # OpenAI's developer role is the system role.
    briefed = lambda role: [{"role": role, "content": "You answer in one word."}, question]  # noqa: E731
    assert model.chat(briefed("developer"), max_tokens=4) == model.chat(briefed("system"), max_tokens=4)
    with pytest.raises(TypeError, match=r"messages must be a list \(or tuple\) of dicts"):
        model.chat("What is the capital of France?")
    with pytest.raises(TypeError, match=r"messages must be a list \(or tuple\) of dicts"):
        model.chat(question)


def test_stream_errors_come_from_the_call(model):
    # Raised by generate(stream=True) itself, not by the first next() of its iterator.
    with pytest.raises(tlm.Error, match="more than the context of 8192"):
        model.generate([1] * 9000, max_tokens=1, stream=True)
    with pytest.raises(tlm.Error, match="the prompt is empty"):
        model.generate("", stream=True)
    with pytest.raises(tlm.Error, match="token id 49152 is outside the vocabulary"):
        model.generate([1, 49152], stream=True)
    with pytest.raises(tlm.Error, match="raise max_tokens to at least 2"):
        model.generate("x", max_tokens=1, json_schema=True, stream=True)
    with pytest.raises(tlm.Error, match="the conversation has .* more than the context of 8192"):
        model.chat([{"role": "user", "content": "word " * 9000}], stream=True)
    with pytest.raises(tlm.Error, match=re.escape("temperature -1.0 is outside [0, 2]")):
        model.chat([{"role": "user", "content": "Hi"}], temperature=-1.0, stream=True)

def test_json_schema(model):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    doc = json.loads(model.chat([{"role": "user", "content": "A person as JSON."}], max_tokens=60,
                                json_schema=json.dumps(schema)))
    assert list(doc) == ["name", "age"] and isinstance(doc["age"], int)
    json.loads(model.generate("Some JSON:", max_tokens=40, json_schema=True, temperature=1.0, seed=5))


def test_config_from_the_file(tmp_path):
    """Without config=, the model is bound to the shipped config its file's hyperparameters fit."""
    assert tlm.Model(MODEL, threads=1).config == "smollm2_135m"
    other = tmp_path / "tiny_llama3.gguf"
    subprocess.run([str(EXAMPLES / "synth_model"), "--config", "tiny_llama3", "--out", str(other)], check=True,
                   capture_output=True)
    with pytest.raises(tlm.Error, match="no config of tlm fits this file(.|\n)*nearest config is tiny_train"):
        tlm.Model(str(other))


def test_errors_carry_the_cpp_message(model):
    with pytest.raises(tlm.Error, match="tiny.gguf does not fit smollm2_135m"):
        tlm.Model(str(TINY), config="smollm2_135m")
    with pytest.raises(tlm.Error, match="tiny.gguf: cannot tell which config the file needs"):
        tlm.Model(str(TINY))
    with pytest.raises(tlm.Error, match="nonexistent.gguf: cannot open"):
        tlm.Model(str(ROOT / "nonexistent.gguf"))
    with pytest.raises(tlm.Error, match="unknown config 'llama3'; known: smollm2_135m"):
        tlm.Model(MODEL, config="llama3")
    with pytest.raises(tlm.Error, match=re.escape("temperature -1.0 is outside [0, 2]; give a temperature")):
        model.generate("x", temperature=-1.0)
    with pytest.raises(tlm.Error, match="an empty stop string"):
        model.generate("x", stop=[""])
    with pytest.raises(tlm.Error, match="token id 49152 is outside the vocabulary"):
        model.logits([1, 49152])
    with pytest.raises(tlm.Error, match="more than the context of 8192"):
        model.generate([1] * 9000, max_tokens=1)
    with pytest.raises(tlm.Error, match="json schema at \\$: the keyword \"pattern\" is not supported"):
        model.generate("x", json_schema='{"type": "string", "pattern": "a+"}')
    with pytest.raises(TypeError, match="messages\\[0\\] needs a string 'role'"):
        model.chat([{"content": "hi"}])
    with pytest.raises(tlm.Error, match="details=True .* does not combine with stream=True"):
        model.generate("x", stream=True, details=True)
    assert issubclass(tlm.Error, RuntimeError)
    # After every error the model still answers.
    assert model.generate("The capital of France is", max_tokens=2) == " Paris."


def test_sampling_keywords_are_the_table(model):
    # Every option of tlm's sampling table (tlm/generation/sampling_options.hpp, which also makes
    # generate's flags and the server's fields) is a keyword of generate() and chat().
    table = tlm._sampling_options()
    names = [o["name"] for o in table]
    assert {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty",
            "penalty_window", "seed", "logit_bias"} <= set(names)
    prompt, chat = "The capital of France is", [{"role": "user", "content": "What is the capital of France?"}]
    plain, plain_chat = model.generate(prompt, max_tokens=6), model.chat(chat, max_tokens=6)
    for o in table:
        # Omitting a keyword is giving the table's default (greedy, so the seed is unused).
        assert o["name"] in model.generate.__doc__ and o["name"] in model.chat.__doc__
        assert model.generate(prompt, max_tokens=6, **{o["name"]: o["default"]}) == plain, o
        assert model.chat(chat, max_tokens=6, **{o["name"]: o["default"]}) == plain_chat, o
        if o["kind"] in ("real", "whole"):
            assert o["min"] <= o["default"] <= o["max"], o
            below = o["min"] if o.get("min_open") else (o["min"] - 0.5 if o["kind"] == "real" else -1)
            for bad in (below, o["max"] + (0.5 if o["kind"] == "real" else 1)):
                with pytest.raises(tlm.Error, match=re.escape(f"{o['name']} {bad!r} is outside {o['range']}")):
                    model.generate(prompt, max_tokens=1, **{o["name"]: bad})
    # The defaults are the library's (tlm::sampling{}), as generate --help shows them.
    defaults = {o["name"]: o["default"] for o in table}
    assert defaults["temperature"] == 0 and defaults["top_p"] == 1 and defaults["penalty_window"] == 64
    assert defaults["seed"] is None and defaults["logit_bias"] == {}
    # Each option takes effect: a ban of the greedy first token changes it; a penalty window.
    first = model.generate(prompt, max_tokens=1, details=True)["ids"][0]
    assert model.generate(prompt, max_tokens=1, logit_bias={first: float("-inf")}, details=True)["ids"][0] != first
    assert model.generate(prompt, max_tokens=1, logit_bias={first: -100}, details=True)["ids"][0] != first
    assert model.generate(prompt, max_tokens=12, repeat_penalty=1.5, penalty_window=0) == \
        model.generate(prompt, max_tokens=12)
    model.generate(prompt, max_tokens=12, repeat_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5,
                   penalty_window=8, top_k=5, top_p=0.9, min_p=0.05, temperature=0.7, seed=3)
    with pytest.raises(tlm.Error, match="logit_bias for token 5 101 is outside"):
        model.generate(prompt, logit_bias={5: 101})
    with pytest.raises(tlm.Error, match="logit_bias names token id 49152, outside the vocabulary"):
        model.generate(prompt, logit_bias={49152: 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        model.generate(prompt, temprature=0.5)
    with pytest.raises(TypeError, match="top_k must be a whole number"):
        model.generate(prompt, top_k=2.5)


def test_gil_released_during_generation(model):
    count, done = [0], threading.Event()

    def counter():
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=counter)
    t.start()
    time.sleep(0.05)
    before = count[0]
    model.generate("Once upon a time", max_tokens=48, ignore_eos=True)
    during = count[0] - before
    done.set()
    t.join()
    # With the GIL held for the whole call the counter could not run at all meanwhile.
    assert during > 10000, during


def test_two_models_in_two_threads(model):
    other = tlm.Model(MODEL, threads=1)
    prompts = ["Once upon a time", "The history of Rome"]
    want = [model.generate(p, max_tokens=48, ignore_eos=True) for p in prompts]
    t0 = time.monotonic()
    for m, p in zip((model, other), prompts):
        m.generate(p, max_tokens=48, ignore_eos=True)
    sequential = time.monotonic() - t0
    got = [None, None]

    def work(i, m):
        got[i] = m.generate(prompts[i], max_tokens=48, ignore_eos=True)

    threads = [threading.Thread(target=work, args=(i, m)) for i, m in enumerate((model, other))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.monotonic() - t0
    assert got == want
    # On a shared 2-core machine the speed-up is not a stable number, so it is reported,
    # not asserted; the GIL test above is what shows the threads are not serialized.
    print(f"two models: sequential {sequential:.2f} s, two threads {parallel:.2f} s, speed-up {sequential / parallel:.2f}")


# ---- tlm.Trainer and tlm.train: the library's trainer, bound directly ----------------

def _training_text(path):
    path.write_text("".join(f"line {i}: the quick brown fox jumps over {i * 7 % 13} lazy dogs\n" for i in range(400)))
    return path


def _cli_arguments(**options):
    """examples/train's command line for these keywords (the table's flags)."""
    kinds = {o["name"]: o["kind"] for o in tlm._training_options()}
    args = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if kinds[name] == "flag":
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args


def test_trainer_steps_lower_the_loss(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    t = tlm.Trainer(config="tiny_train", data=data, steps=30, batch=4, seq=32, lr=3e-3, eval_every=10, out=tmp_path / "o")
    assert (t.config, t.steps, t.total_steps, t.done) == ("tiny_train", 0, 30, False)
    h0 = t.held_out_loss()
    reports = [t.step() for _ in range(5)]
    reports += list(t)  # iteration runs the remaining steps
    assert [r["step"] for r in reports] == list(range(1, 31)) and t.done
    losses = [r["loss"] for r in reports]
    assert all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert reports[0]["held_out"] is None and reports[9]["held_out"] is not None
    assert reports[-1]["held_out"] < h0
    assert reports[0]["total"] == 30 and reports[0]["lr"] > 0 and reports[0]["grad_norm"] > 0
    f = t.finish()
    assert f["exported"] and f["saved"] and f["step"] == 30
    assert pathlib.Path(f["model"]) == tmp_path / "o" / "model.gguf" and pathlib.Path(f["model"]).is_file()
    assert [row["step"] for row in t.log] == list(range(1, 31))
    with pytest.raises(tlm.Error, match=r"finish\(\) ended this run; continue it with a new Trainer\(\.\.\., resume=True\)"):
        t.step()


def test_train_from_scratch_equals_the_command_line_run(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    opts = dict(config="tiny_train", data=data, steps=12, batch=4, seq=32, lr=3e-3, warmup=2, eval_every=4,
                save_every=6, seed=5, threads=1)
    lines = []
    r = tlm.train(out=tmp_path / "py", on_line=lines.append, **opts)
    assert r["model"] == tmp_path / "py" / "model.gguf" and r["model"].is_file()
    assert [row["step"] for row in r["losses"]] == list(range(1, 13))
    assert any(line.startswith("train: tiny_train from scratch") for line in lines)
    assert any(re.match(r"step 12 loss [0-9.]+ held_out [0-9.]+ lr ", line) for line in lines)
    assert r["losses"][-1]["loss"] < r["losses"][0]["loss"]
    assert r["losses"][3]["held_out_loss"] is not None and r["losses"][0]["held_out_loss"] is None
    # The same options on the command line: the same run, loss for loss and byte for byte.
    cli = [os.path.join(EXAMPLES, "train")] + _cli_arguments(out=tmp_path / "cli", **opts)
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL)
    cut = lambda p: [line.split(",")[:4] for line in p.read_text().splitlines()]  # noqa: E731
    assert cut(tmp_path / "py" / "loss.csv") == cut(tmp_path / "cli" / "loss.csv")
    assert (tmp_path / "py" / "model.gguf").read_bytes() == (tmp_path / "cli" / "model.gguf").read_bytes()
    # The result is a model like any other.
    m = tlm.Model(str(r["model"]), config="tiny_train", threads=1)
    assert m.config == "tiny_train"
    assert m.tokenize("line") == list(b"line")


def test_train_on_step_receives_the_reports(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    seen, lines = [], []
    r = tlm.train(config="tiny_train", data=data, steps=3, seq=16, out=tmp_path / "o", on_step=seen.append, on_line=lines.append)
    assert [x["step"] for x in seen] == [1, 2, 3] and r["exported"]
    assert not any(line.startswith("step ") for line in lines)  # the reports went to on_step instead


def test_train_errors_come_through(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    with pytest.raises(tlm.Error, match=r"lr 0 is outside \(0, 1\]"):
        tlm.train(config="tiny_train", data=data, steps=1, lr=0, out=tmp_path / "o", on_line=None)
    with pytest.raises(tlm.Error, match=r"steps takes a whole number from 1 to 1000000000, got -3"):
        tlm.Trainer(config="tiny_train", data=data, steps=-3)
    with pytest.raises(tlm.Error, match=r"--min-lr 0.5 is above --lr 0.1"):
        tlm.Trainer(config="tiny_train", data=data, steps=1, lr=0.1, min_lr=0.5)
    with pytest.raises(tlm.Error, match=r"no checkpoint to resume from"):
        tlm.train(config="tiny_train", data=data, steps=1, resume=True, out=tmp_path / "none", on_line=None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'learning_rate'; the keywords are model, config, data, .*lr"):
        tlm.Trainer(config="tiny_train", data=data, steps=1, learning_rate=0.1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'learning_rate'"):
        tlm.train(config="tiny_train", data=data, steps=1, learning_rate=0.1, on_line=None)
    with pytest.raises(TypeError, match=r"chat is a switch"):
        tlm.train(config="tiny_train", data=data, steps=1, chat="yes", on_line=None)
    with pytest.raises(TypeError, match=r"steps must be a whole number"):
        tlm.Trainer(config="tiny_train", data=data, steps=2.5)
    with pytest.raises(tlm.Error, match=r"unknown config 'tiny_nothing'"):
        tlm.Trainer(config="tiny_nothing", data=data, steps=1)
    # A finished run in out is neither resumed nor deleted by accident.
    tlm.train(config="tiny_train", data=data, steps=2, seq=16, out=tmp_path / "run", on_line=None)
    with pytest.raises(tlm.Error, match=r"holds an earlier run \(checkpoint-2, model.gguf\); continue it with --resume, "
                                        r"replace it with --overwrite"):
        tlm.Trainer(config="tiny_train", data=data, steps=2, seq=16, out=tmp_path / "run")
    assert tlm.Trainer(config="tiny_train", data=data, steps=2, seq=16, out=tmp_path / "run", overwrite=True).steps == 0


def test_train_options_are_the_train_programs_flags():
    # Every flag train --help names (in its option column or in another option's text) is
    # a keyword of the table tlm.Trainer reads, and each keyword a flag: a flag added to
    # examples/train outside the table, or a row the help does not document, fails this.
    help_text = subprocess.run([str(EXAMPLES / "train"), "--help"], check=True, capture_output=True, text=True).stdout
    flags = {m.replace("-", "_") for m in re.findall(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)", help_text)}
    assert "model" in flags and "lora_alpha" in flags  # the pattern reads the help at all
    flags.discard("help")  # train prints its help; tlm.Trainer has the docstring
    table = tlm._training_options()
    ours = {o["name"] for o in table}
    assert flags == ours, f"only in train --help: {sorted(flags - ours)}; only in the table: {sorted(ours - flags)}"
    for o in table:  # each keyword's line in the docstring
        assert f"\n  {o['name']}: {o['help']}" in tlm.Trainer.__doc__
    # The defaults train --help states are the table's.
    defaults = {o["name"]: o["default"] for o in table}
    for name in ("batch", "seq", "lr", "min_lr", "warmup", "clip", "weight_decay", "held_out", "eval_every", "save_every",
                 "keep_checkpoints", "threads", "seed", "accumulate"):
        m = re.search(r"--" + name.replace("_", "-") + r" [A-Z]+ .*?\(default ([0-9.e-]+)", help_text, re.S)
        assert m and float(m.group(1)) == defaults[name], name


def test_trainer_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    data = _training_text(tmp_path / "text.txt")
    opts = dict(config="tiny_train", data=data, steps=8, batch=2, seq=16, seed=2, threads=1, save_every=100)
    full = tlm.Trainer(out=tmp_path / "full", **opts)
    full.run()
    first = tlm.Trainer(out=tmp_path / "split", **opts)
    for _ in range(3):
        first.step()
    f = first.finish()  # a checkpoint of step 3, no export
    assert f["saved"] and not f["exported"] and f["checkpoint"].endswith("checkpoint-3")
    assert not (tmp_path / "split" / "model.gguf").exists()
    rest = tlm.Trainer(out=tmp_path / "split", resume=True, **opts)
    assert rest.steps == 3
    rest.run()
    assert [(x["step"], x["loss"]) for x in rest.log] == [(x["step"], x["loss"]) for x in full.log]
    assert (tmp_path / "split" / "model.gguf").read_bytes() == (tmp_path / "full" / "model.gguf").read_bytes()
    # A changed learning rate is taken, with the trainer's warning, on stderr and in messages.
    capsys.readouterr()
    more = tlm.Trainer(out=tmp_path / "split", resume=True, **{**opts, "steps": 10, "lr": 1e-3})
    assert any("this run uses 0.001" in m for m in more.messages)
    assert "tlm.Trainer: warning: the checkpoint was made with --lr 0.0003, this run uses 0.001" in capsys.readouterr().err


def test_ctrl_c_stops_run_at_a_step_with_a_checkpoint(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    opts = dict(config="tiny_train", data=data, steps=100000, batch=2, seq=16, save_every=0, out=tmp_path / "o")
    t = tlm.Trainer(**opts)

    def interrupt():  # once a step has run: the main thread is then inside run() with the GIL released
        while t.steps < 1:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        t.run()
    assert time.monotonic() - start < 60
    stopped = t.steps
    assert 1 <= stopped < 100000 and t.finished
    assert (tmp_path / "o" / f"checkpoint-{stopped}.gguf").is_file() and not (tmp_path / "o" / "model.gguf").exists()
    assert any(f"stopped at step {stopped} of 100000" in m for m in t.messages)
    resumed = tlm.Trainer(resume=True, **opts)
    assert resumed.steps == stopped
    assert resumed.step()["step"] == stopped + 1


def test_ctrl_c_in_a_step_loop_then_finish(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    t = tlm.Trainer(config="tiny_train", data=data, steps=50, batch=2, seq=16, out=tmp_path / "o")
    with pytest.raises(KeyboardInterrupt):
        for r in t:
            if r["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler raises here, in the loop's body
    assert t.steps == 2
    f = t.finish()
    assert f["saved"] and f["checkpoint"].endswith("checkpoint-2") and not f["exported"]


def test_gil_released_during_training_steps(tmp_path):
    data = _training_text(tmp_path / "text.txt")
    t = tlm.Trainer(config="tiny_train", data=data, steps=40, batch=8, seq=64, eval_every=0, out=tmp_path / "o")
    count, stop = [0], threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=counter)
    th.start()
    try:
        before = count[0]
        t.run()  # one C++ call: the counter runs only while a step lets go of the GIL
        during = count[0] - before
    finally:
        stop.set()
        th.join()
    assert during > 1000


def test_lora_trainer_equals_the_command_line_run(tmp_path):
    # A LoRA adapter (rank 16, the test wheel's) over a random tiny_train model in Q4_1.
    base = tmp_path / "tiny-q4_1.gguf"
    subprocess.run([str(EXAMPLES / "synth_model"), "--config", "tiny_train", "--encoding", "q4_1", "--std", "0.1", "--out",
                    str(base)], check=True, capture_output=True)
    data = _training_text(tmp_path / "text.txt")
    opts = dict(model=base, data=data, lora=16, lora_alpha=32, steps=3, seq=8, batch=2, eval_every=0, threads=1)
    t = tlm.Trainer(out=tmp_path / "py", **opts)
    assert t.config == "tiny_train"  # from the file
    f = t.run()
    assert f["exported"] and f["model"] == str(tmp_path / "py" / "adapter.gguf")
    cli = [os.path.join(EXAMPLES, "train")] + _cli_arguments(out=tmp_path / "cli", **opts)
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL)
    assert (tmp_path / "py" / "adapter.gguf").read_bytes() == (tmp_path / "cli" / "adapter.gguf").read_bytes()
    with pytest.raises(tlm.Error, match=r"--lora 8: this build trains LoRA ranks 16; give one of them"):  # the wheel's ranks
        tlm.Trainer(out=tmp_path / "r8", **{**opts, "lora": 8})


def test_the_wheel_has_no_train_program():
    assert not (pathlib.Path(tlm.__file__).parent / "bin").exists()


LORA_SMALL = ROOT / "tests" / "fixtures" / "lora" / "small.gguf"


def test_lora_logits_equal_generate_lora_bit_for_bit(tmp_path):
    ids = [504, 3458, 282, 4649, 314]
    m = tlm.Model(MODEL, threads=1, lora=[(LORA_SMALL, 0.5), str(LORA_SMALL)])
    dump = tmp_path / "logits.f32"
    run("generate", "--threads", "1", "--token-ids", ",".join(map(str, ids)), "-n", "1", "--dump-logits", str(dump),
        "--lora", str(LORA_SMALL), "--lora-scale", "0.5", "--lora", str(LORA_SMALL))
    theirs = np.fromfile(dump, dtype=np.float32).reshape(len(ids), -1)
    ours = m.logits(ids)
    assert np.array_equal(ours, theirs)
    base = tlm.Model(MODEL, threads=1).logits(ids)
    assert not np.array_equal(ours, base)  # the adapters are applied
    zero = tlm.Model(MODEL, threads=1, lora=(pathlib.Path(LORA_SMALL), 0.0)).logits(ids)
    assert np.array_equal(zero, base)  # scale 0: the base, bit for bit


def test_lora_errors_name_the_file_and_tensor():
    with pytest.raises(tlm.Error, match=r"nonexistent\.gguf: cannot open the LoRA adapter: no such file"):
        tlm.Model(MODEL, lora=str(ROOT / "nonexistent.gguf"))
    with pytest.raises(tlm.Error, match=r"nan\.gguf: tensor 'blk\.0\.attn_q\.weight\.lora_b' holds a NaN"):
        tlm.Model(MODEL, lora=ROOT / "tests" / "fixtures" / "lora" / "nan.gguf")
    with pytest.raises(tlm.Error, match=r"the scale of an adapter must be a finite number"):
        tlm.Model(MODEL, lora=(LORA_SMALL, float("nan")))
