"""Writes the committed tokenizer fixtures in tests/fixtures/tokenizer/ from Hugging Face
`tokenizers` (the reference built in tokenizer_common.py) and jinja2.

    .venv/bin/python tests/reference/make_tokenizer_fixtures.py [--model PATH]

Files (a compact text format; every record's text is length-prefixed, so any byte is fine):
  encode.txt  "E <flags> <nbytes>\\n<text>\\n<ids separated by spaces>\\n"
              flags: 1 = parse_special. The ids are HF's.
  decode.txt  "D <count>\\n<ids>\\n<nbytes>\\n<text>\\n" where text is HF's decode
              (skip_special_tokens=False).
  chat.txt    "C <n_messages> <add_generation_prompt>\\n" then per message
              "<role bytes> <content bytes>\\n<role><content>\\n", then "<nbytes>\\n<rendered>\\n",
              rendered by jinja2 from the model's tokenizer.chat_template.
  template.txt  the model's chat template (raw bytes).
The seed is fixed, so re-running gives the same files.
"""
import argparse
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tokenizer_common import build_hf_tokenizer, hf_decode, hf_encode  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 20261129

FIXED_TEXTS = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\t\t\n", "\r\n", "a\r\nb\r\n\r\nc", " \n \n ",
    "Hello world! 123", "Hello, world!", "hello world", "HELLO WORLD", "Hello  world", "Hello   world   ",
    "The quick brown fox jumps over the lazy dog.",
    "It's, they're, we've, I'm, you'll, he'd, she's. IT'S THEY'RE",
    "don't won't can't shan't 'tis 's 't 're 've 'm 'll 'd ''",
    "Antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious" * 3,
    "a" * 300, "ab" * 200, " " * 100, "\n" * 50, "x" + " " * 33 + "y", "!!!!!!!???...,,,;;;",
    "int main(int argc, char** argv) {\n    return 0;\n}\n",
    "def f(x):\n\tif x > 0:\n\t\treturn x ** 2  # square\n\treturn -x\n",
    "for (size_t i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "<html><body class=\"main\">&nbsp;&lt;tag&gt;</body></html>",
    '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b"}}',
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "https://example.com/path?query=1&x=%20y#frag", "user@example.org",
    "    indented four\n        eight\n", "trailing spaces   \nnext", "tabs\tin\tbetween\t",
    "0", "1", "12", "123", "1234567890", "3.14159", "-42", "1,000,000", "v1.2.3", "2024-01-01T12:00:00Z",
    "0x1F 0b1010 1e-9", " 1 2 3 ", "a1b2c3", "x  1", "x   \n1",
    "٠١٢٣٤٥٦٧٨٩ العربية ١٢٣", "०१२३४५६७८९ हिन्दी", "০১২৩ বাংলা", "๐๑๒๓ ไทย", "①②③ ⅠⅡⅢ ½ ¾ ²³",
    "一二三 三千 4万", "𝟘𝟙𝟚 𝟬", "߀߁߂", "𑁦𑁧", "Ⅻ ↂ 〇 〡〢",
    "café naïve résumé façade", "Ångström Ørsted Æther œuvre", "Ελληνικά γλώσσα", "Русский язык, ёж",
    "e\u0301 a\u0300 n\u0303 (combining)", "ǅ ǈ ǋ ǲ ß ẞ ﬁ ﬂ",
    "日本語のテキストです。", "中文文本，标点符号！", "한국어 텍스트입니다", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "ሰላም ዓለም", "Բարեւ աշխարհ",
    "👋🌍", "👩‍👩‍👧‍👦 family", "👍🏽 thumbs", "🇺🇸🇫🇷 flags", "❤️ ✨ 🏳️‍🌈", "😀😃😄😁😆😅🤣😂",
    "\u200b zero\u200dwidth\u200c joiners \ufeffBOM", "\u00a0nbsp\u00a0\u00a0x", "\u2028line\u2029para",
    "\u3000ideographic\u3000\u3000space", "\u0085nel\u0085\u0085x", "\u180emvs\u180e\u180ex", "\u1680ogham",
    "\u2000\u2001\u2002\u2003\u2009\u200a\u202f\u205f", "\x00nul\x01\x02\x03", "\x04\x06\x13\x14\x16\x1d dropped",
    "\x1c\x1d\x1e\x1f separators", "\x7f del \x80\x9f c1", "\x0b\x0c vt ff",
    "\U00040000 \U0007FFFF plane 4-7", "\U000C0000 \U000FFFFD private", "\U0010FFFF max", "\ue000 pua",
    "\ufffd replacement", "\ufffe\uffff nonchars",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more", "<|im_start|><|im_start|>", "<|im_start", "im_start|>", "<|im_start|>x<|im_end",
    "<repo_name>a<reponame>b<file_sep>c<filename>d<gh_stars>5", "<issue_start><issue_comment><issue_closed>",
    "<jupyter_start><jupyter_text><jupyter_code><jupyter_output><jupyter_script><empty_output>",
    " <|im_end|> ", "<<|im_end|>>", "<|IM_END|>",
    "Mixed: English, 日本語, عربي, 123, 😀, and code `x += 1;`",
    "She said: «Bonjour» — and left… “quotes” ‘single’",
    "$$\\frac{a}{b} + \\sqrt{x^2}$$", "~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
    "line1\nline2\n\nline4\n\n\n\nline8", "    \n\t\n  \r\n",
]


# Long repetitive pieces (17-300 characters). A pre-token of more than 16 symbols is
# merged through the heap, where equal merge ranks are broken by position; runs of one
# repeated pair are where a wrong tie-break shows (few random texts have such runs).
RUN_LENGTHS = [17, 18, 19, 20, 23, 24, 31, 32, 33, 47, 48, 63, 64, 65, 99, 100, 101, 127, 128, 129, 200, 255, 256, 299, 300]
RUN_UNITS = [" ", "\n", "\t", " \n", "\n\n ", "\r\n", "-", "=", ".", "!", "?", "*", "#", "_", "/", "!?", "..", "-=",
             "=-", ".,", ";)", "<>", "0", "01", "a", "ab", "aab", "abc", "ha", "la", "lol", "na", "ee", "\u00e9",
             "\u00e9e", "\u65e5", "\u65e5\u672c", "\U0001F600", " the", " the the", "the ", "bla", "ok ", "x\n"]


def long_runs():
    out = []
    for unit in RUN_UNITS:
        for n in RUN_LENGTHS:
            text = (unit * (n // len(unit) + 1))[:n]
            out.append(text)
    # Repeated words with a varied gap, and runs inside text.
    for n in (17, 40, 120, 300):
        out.append(("word " * n)[:n])
        out.append("x" + " " * n + "y")
        out.append("end." + "\n" * n + "start")
        out.append("(" + "=" * n + ")")
    return out


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
            "<filename>", "<gh_stars>", "<jupyter_code>", "<empty_output>"]


def random_texts(rng):
    blocks = [
        (0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
        (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
        (0x1680, 0x180F), (0x2000, 0x206F), (0x2070, 0x218F), (0x2190, 0x2BFF), (0x3000, 0x30FF),
        (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF), (0xFB00, 0xFFFF), (0x10000, 0x1039F),
        (0x11000, 0x11FFF), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF),
        (0x30000, 0x3134F), (0x40000, 0xBFFFF), (0xE0000, 0xE01EF), (0xF0000, 0x10FFFF),
    ]
    common = " \n\t  0123456789aeiouAEIOU'.,"
    out = []
    for i in range(1200):
        n = rng.randint(1, 40)
        k = rng.sample(blocks, rng.randint(1, 3))
        chars = []
        for _ in range(n):
            r = rng.random()
            if r < 0.35:
                chars.append(rng.choice(common))
            else:
                lo, hi = rng.choice(k)
                c = rng.randint(lo, hi)
                if 0xD800 <= c < 0xE000:
                    c = 0xFFFD
                chars.append(chr(c))
        if rng.random() < 0.15:  # a special-token string somewhere, sometimes damaged
            sp = rng.choice(SPECIALS)
            if rng.random() < 0.3:
                sp = sp[:rng.randint(1, len(sp) - 1)]
            chars.insert(rng.randint(0, len(chars)), sp)
        out.append("".join(chars))
    for i in range(400):
        raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 48)))
        out.append(raw.decode("utf-8", errors="replace"))
    return out


def write_encode(path, tok, texts):
    recs = []
    for text, special in texts:
        ids = hf_encode(tok, text, special)
        data = text.encode("utf-8")
        recs.append(b"E %d %d\n" % (1 if special else 0, len(data)) + data + b"\n" +
                    " ".join(map(str, ids)).encode() + b"\n")
    path.write_bytes(b"".join(recs))
    return len(recs)


def write_decode(path, tok, rng, vocab):
    recs = []
    for i in range(1600):
        n = rng.randint(1, 24)
        if i % 4 == 0:  # low ids: single bytes and short pieces, more split UTF-8
            ids = [rng.randrange(0, 512) for _ in range(n)]
        else:
            ids = [rng.randrange(0, vocab) for _ in range(n)]
        text = hf_decode(tok, ids).encode("utf-8")
        recs.append(b"D %d\n" % n + " ".join(map(str, ids)).encode() + b"\n%d\n" % len(text) + text + b"\n")
    path.write_bytes(b"".join(recs))
    return len(recs)


def write_chat(path, template):
    try:
        import jinja2
    except ImportError:
        sys.exit("make_tokenizer_fixtures: jinja2 is missing; install tests/reference/requirements.txt into .venv "
                 "(scripts/setup) rather than leaving chat.txt stale")

    env = jinja2.Environment()
    t = env.from_string(template)
    convos = [
        [],
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
         {"role": "user", "content": "Tell me a joke.\nA short one."}],
        [{"role": "assistant", "content": "I start."}, {"role": "user", "content": ""}],
        [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}],
        [{"role": "system", "content": ""}],
        [{"role": "user", "content": "日本語 😀 <|im_end|> {{ not jinja }} {% raw %}"}],
        [{"role": "tool", "content": "{\"result\": 42}"}, {"role": "user", "content": "ok"}],
    ]
    recs = []
    for msgs in convos:
        for gen in (False, True):
            out = t.render(messages=msgs, add_generation_prompt=gen).encode("utf-8")
            rec = b"C %d %d\n" % (len(msgs), 1 if gen else 0)
            for m in msgs:
                r, c = m["role"].encode(), m["content"].encode()
                rec += b"%d %d\n" % (len(r), len(c)) + r + c + b"\n"
            rec += b"%d\n" % len(out) + out + b"\n"
            recs.append(rec)
    path.write_bytes(b"".join(recs))
    return len(recs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "tokenizer"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok, md = build_hf_tokenizer(args.model)
    rng = random.Random(SEED)

    fixed = [(t, False) for t in FIXED_TEXTS] + [(t, True) for t in FIXED_TEXTS if "<" in t]
    fixed += [(t, True) for t in FIXED_TEXTS[:20]]
    fixed += [(t, False) for t in long_runs()]
    rand = [(t, rng.random() < 0.2) for t in random_texts(rng)]
    n_fixed = write_encode(out / "encode_fixed.txt", tok, fixed)
    n_rand = write_encode(out / "encode_random.txt", tok, rand)
    n_dec = write_decode(out / "decode.txt", tok, rng, len(md["tokens"]))
    (out / "template.txt").write_bytes(md["chat_template"].encode("utf-8"))
    n_chat = write_chat(out / "chat.txt", md["chat_template"])  # jinja2 is pinned in requirements.txt
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"fixed encode {n_fixed}, random encode {n_rand}, decode {n_dec}, chat {n_chat}; {size} bytes in {out}")


if __name__ == "__main__":
    main()
