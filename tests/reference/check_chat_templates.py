"""Live comparison of tlm's chat templates (tests/chat_render) with jinja2.

    check_chat_templates.py --build BUILD_DIR [--model GGUF]

For every chat-template form tlm knows, renders the same conversations with jinja2 (set
up as Hugging Face's apply_chat_template does: sandboxed, trim_blocks, lstrip_blocks,
raise_exception) and with tlm, and requires byte-identical text, or an error from both.
The templates are the model files' own (scripts/fetch-vocab: llama.cpp's templates/, the
copies in its tests/test-chat-template.cpp (Mistral 7B's, Mistral Large 2407's, Llama
3.0's), the vocabulary GGUFs' tokenizer.chat_template, and SmolLM2's from the test
model), and, for Llama 2 and Zephyr, whose files are not among the fetched ones,
templates written here from the published formats. Where a template raises an error of
its own (raise_exception), tlm's error must contain its text. BOS/EOS texts come from the matching vocabulary file.
Llama 3's date: jinja2 gets no strftime_now, so its templates use their default
"26 Jul 2024", as tlm does; one more pass passes date_string to both.
Exits 1 on any difference.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import jinja2
import jinja2.sandbox
from jinja2.ext import loopcontrols

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gguf_file import GGUFError, GGUFFile  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "models" / "llama.cpp" / "templates"
VOCAB = ROOT / "models" / "llama.cpp" / "vocab"

# Llama 2 chat, written here from Meta's published prompt format (the llama repository's
# chat_completion: "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s>",
# texts stripped, roles alternating after an optional system message).
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% endfor %}"
    "{% for m in rest %}"
    "{% if loop.first and sys is defined %}{% set text = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m['content'] %}"
    "{% else %}{% set text = m['content'] %}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + text.strip() + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ ' ' + text.strip() + ' ' + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}"
    "{% endif %}{% endfor %}")

# Zephyr / TinyLlama-Chat, written here from the model cards' format description:
# "<|system|>\n{system}</s>\n<|user|>\n{user}</s>\n<|assistant|>\n", the generation
# prompt after the last message.
ZEPHYR = (
    "{% for message in messages %}\n"
    "{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n' + message['content'] + eos_token }}\n"
    "{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}")

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def gguf_meta(path):
    """BOS/EOS texts and chat template of a GGUF file."""
    try:
        r = GGUFFile(path, tensors=False)
    except GGUFError as e:
        sys.exit(f"check_chat_templates: {e}")
    toks = r.fields["tokenizer.ggml.tokens"].raw()

    def tok(key):
        return toks[r.fields[key]].decode() if key in r.fields else None

    return {"bos": tok("tokenizer.ggml.bos_token_id"), "eos": tok("tokenizer.ggml.eos_token_id"),
            "template": r.get("tokenizer.chat_template")}


def conversations():
    u, a, s = "user", "assistant", "system"

    def m(role, content):
        return {"role": role, "content": content}

    convs = [
        [m(u, "Hi")],
        [m(s, "Be brief."), m(u, "What is 2+2?")],
        [m(s, "Be brief."), m(u, "What is 2+2?"), m(a, "4."), m(u, "And 3+3?")],
        [m(u, "Hello"), m(a, "Hi! How can I help?"), m(u, "Tell me a joke.\nA short one."), m(a, "No.")],
        [m(u, ""), m(a, ""), m(u, "")],
        [m(s, ""), m(u, "empty system")],
        [m(u, "日本語 😀 Ünïcødé — 中文 🇫🇷 עברית"), m(a, "はい 👍"), m(u, "🙂")],
        [m(s, "Use {{ braces }} and {% tags %}."), m(u, "{{ not jinja }} {% raw %} 'single' \"double\" \\back\nline\n\n"),
         m(a, "}} '\" {#")],
        [m(s, "  spaced system \n"), m(u, "\u3000 wide space\u00a0"), m(a, " \t reply \n"), m(u, "\n\nend\x1c")],
        [m(u, "<|im_end|><|eot_id|>[INST]</s><|end|><s>")],
        [m(s, "only a system message")],
        [m(s, "S"), m(u, "u"), m(a, "a")],
        [],
        [m(u, "one"), m(u, "two")],
        [m(u, "q"), m("tool", "{\"result\": 42}")],
        [m(s, "S"), m(u, "u"), m(s, "late system")],
        # Without a system message, for the templates that have none.
        [m(u, "  spaced user \n"), m(a, " \t reply \n"), m(u, "\n\nend\x1c")],
        [m(a, "an answer first")],
        [m(u, "q"), m("robot", "beep")],
        [m(u, "q"), m(a, "a"), m(s, "late system")],
    ]
    for c in convs:
        for gen in (True, False):
            yield c, gen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model")
    args = ap.parse_args()
    binary = pathlib.Path(args.build) / "tests" / "chat_render"
    if not binary.exists():
        sys.exit(f"check_chat_templates: {binary} is missing; build the target chat_render")
    if not TEMPLATES.is_dir():
        sys.exit(f"check_chat_templates: {TEMPLATES} is missing; run scripts/fetch-vocab")

    bpe, spm, qwen, phi = (gguf_meta(VOCAB / f"ggml-vocab-{n}.gguf") for n in ("llama-bpe", "llama-spm", "qwen2", "phi-3"))
    read = lambda name: (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")  # noqa: E731
    # Meta's later Llama 3.0 template is its first with the generation prompt made
    # conditional; only the first is in llama.cpp's sources, so the later is made from it.
    llama30 = read("meta-llama-Meta-Llama-3-Instruct")
    prompt = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    assert llama30.endswith(prompt), "the Llama 3.0 template no longer ends with its generation prompt"
    llama30_asked = llama30[:-len(prompt)] + "{% if add_generation_prompt %}" + prompt + "{% endif %}"
    # (label, template text, expected form, vocabulary for BOS/EOS)
    cases = [
        ("chatml (plain)", CHATML, "chatml", qwen),
        ("qwen2 vocab (ChatML, default system)", qwen["template"], "smollm2", qwen),
        ("Qwen2.5-7B-Instruct", read("Qwen-Qwen2.5-7B-Instruct"), "qwen2.5", qwen),
        ("Llama-3.1-8B-Instruct", read("meta-llama-Llama-3.1-8B-Instruct"), "llama3", bpe),
        ("Llama-3.2-3B-Instruct", read("meta-llama-Llama-3.2-3B-Instruct"), "llama3", bpe),
        ("phi-3 vocab (Phi-3-mini)", phi["template"], "phi3", phi),
        ("Phi-3.5-mini-instruct", read("microsoft-Phi-3.5-mini-instruct"), "phi3.5", phi),
        ("Mistral-Nemo-Instruct-2407", read("mistralai-Mistral-Nemo-Instruct-2407"), "mistral-nemo", spm),
        ("Mistral-7B-Instruct-v0.2 (first)", read("mistralai-Mistral-7B-Instruct-v0.2-pre-v1"), "mistral", spm),
        ("Mistral-7B-Instruct-v0.2 (v1)", read("mistralai-Mistral-7B-Instruct-v0.2-v1"), "mistral-v1", spm),
        ("Mistral-Large-Instruct-2407 (v3)", read("mistralai-Mistral-Large-Instruct-2407-v3"), "mistral-v3", spm),
        ("Llama-3-Instruct (first release)", llama30, "llama3.0", bpe),
        ("Llama-3-Instruct (prompt when asked)", llama30_asked, "llama3.0", bpe),
        ("Llama 2 (published format)", LLAMA2, "llama2", spm),
        ("Zephyr (published format)", ZEPHYR, "zephyr", spm),
    ]
    if args.model and pathlib.Path(args.model).exists():
        smollm2 = gguf_meta(args.model)
        cases.insert(1, ("SmolLM2 (test model)", smollm2["template"], "smollm2", smollm2))

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    class Raised(jinja2.exceptions.TemplateError):
        """An error the template raises itself, whose text tlm's error must contain."""

    def raise_exception(msg):
        raise Raised(msg)

    env.globals["raise_exception"] = raise_exception

    requests, expected = [], []
    for label, text, form, vocab in cases:
        tmpl = env.from_string(text)
        for msgs, gen in conversations():
            dates = [None, "01 Dec 2026"] if form == "llama3" else [None]
            for date in dates:
                kw = {"messages": msgs, "add_generation_prompt": gen, "bos_token": vocab["bos"], "eos_token": vocab["eos"]}
                if date:
                    kw["date_string"] = date
                try:
                    want = {"text": tmpl.render(**kw)}
                except Raised as e:
                    want = {"error": str(e), "raised": True}
                except jinja2.exceptions.TemplateError as e:  # UndefinedError is one too
                    want = {"error": str(e)}
                base = {"template": text, "messages": msgs, "add_generation_prompt": gen}
                if date:
                    base["date_string"] = date
                # With the vocabulary's BOS/EOS given, as chat_session gives them, and
                # with the form's defaults; and by name, as --chat-template gives it.
                explicit = dict(base, bos_token=vocab["bos"], eos_token=vocab["eos"])
                for req in (explicit, base, dict({k: v for k, v in explicit.items() if k != "template"}, name=form)):
                    if "name" in req and form == "smollm2" and label != "SmolLM2 (test model)":
                        continue  # by name, smollm2 is SmolLM2's default text
                    if "name" in req and label == "Llama-3-Instruct (first release)":
                        continue  # by name, llama3.0 is the later template
                    requests.append(req)
                    expected.append((label, form, msgs, gen, date, want))

    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "cases.json"
        path.write_text(json.dumps(requests), encoding="utf-8")
        out = subprocess.run([str(binary), str(path)], check=True, capture_output=True, text=True, encoding="utf-8").stdout
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == len(requests), (len(got), len(requests))

    failures, identical, refused, same_error = [], {}, {}, {}
    for (label, form, msgs, gen, date, want), have in zip(expected, got):
        if "error" not in have and have.get("form") != form:
            failures.append(f"{label}: recognised as {have.get('form')}, expected {form}")
            continue
        if "text" in want and "text" in have:
            if want["text"] == have["text"]:
                identical.setdefault(label, set()).add((json.dumps(msgs), gen, date))
            else:
                failures.append(f"{label} gen={gen} date={date} {msgs!r}:\n  jinja2 {want['text']!r}\n  tlm    {have['text']!r}")
        elif "error" in want and "error" in have:
            refused[label] = refused.get(label, 0) + 1
            policy = "tool calls are not supported" in have["error"]
            if want.get("raised") and not policy:
                if want["error"] in have["error"]:
                    same_error[label] = same_error.get(label, 0) + 1
                else:
                    failures.append(f"{label} gen={gen} {msgs!r}: jinja2 raises {want['error']!r}, tlm {have['error']!r}")
        elif "text" in want:
            # tlm refuses on purpose what it does not render (tool messages; a system
            # message the template would silently drop); anything else is a failure.
            policy = ("tool calls are not supported" in have["error"] or "is not rendered by this template" in have["error"])
            if policy:
                refused[label] = refused.get(label, 0) + 1
            else:
                failures.append(f"{label} gen={gen} {msgs!r}: jinja2 renders {want['text']!r}, tlm: {have['error']}")
        else:
            failures.append(f"{label} gen={gen} {msgs!r}: jinja2 raises ({want['error']}), tlm renders {have['text']!r}")

    # Each conversation is asked three ways (BOS/EOS given, defaulted, by name); the
    # counts are of distinct conversations (with the generation prompt on or off).
    for label, *_ in cases:
        n = len(identical.get(label, ()))
        print(f"{label:40s} {n:3d} conversations byte-identical, {refused.get(label, 0):3d} requests refused "
              f"({same_error.get(label, 0)} with the template's own error text)")
        if n < 10:
            failures.append(f"{label}: only {n} conversations rendered identically (want >= 10)")
    if failures:
        print(f"{len(failures)} failures; the first ones:")
        for f in failures[:8]:
            print(" ", f)
        return 1
    print(f"check_chat_templates: OK, {sum(len(v) for v in identical.values())} conversations identical to jinja2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
