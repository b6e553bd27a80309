#!/usr/bin/env python3
"""Compiles every C++ example of the README and of the headers' comments (-fsyntax-only).

A code example in a header comment or the README is a promise: this check makes it one
the compiler keeps. What counts as an example:

  README.md     every ```cpp or ```c++ fenced block.
  headers       a comment line `// Example:` (or `// Example (KIND):`, `// Example, given
                DECLS:`) followed by lines indented `//   `; a bare `//` line inside
                the block is a blank line, any other line ends it.

How a block is compiled, from the words after the language (README) or in the marker:

  (none)        statements: the body of a function (its return type is deduced, so a
                block may `return`).
  file          declarations at namespace scope (a struct, a whole program with main).
  members       declarations inside a struct (a config's static constexpr fields).
  ignore        not compiled, and counted in the summary: for a fragment that cannot
                stand alone. Say why beside it.
  given DECLS   DECLS (one line, C++ declarations separated by `;`) are placed at
                namespace scope before the block: the names the example takes as given
                (a path, a token array, the caller's function).

Each source (the README, each header) becomes one translation unit; a header's examples
are compiled with only that header and a few standard headers included, the README's
with its blocks' own #include lines (hoisted to the top) and, when a block names no tlm
header, <tlm/generate.hpp>, <tlm/configs.hpp> and <tlm/train/trainer.hpp>. A header's
example may name more headers it needs with `//   #include <...>` lines, hoisted too.
Each block sits in a namespace of its own (a `file` block at global scope, where `main`
is the program's) and its lines carry #line directives, so an error names README.md or
the header and the line of the example itself.

A header comment line that looks like code (an indented `//   ` line naming `tlm::` and
ending with `;` or `{`) outside any marked block is an error too: an unmarked example
would not be compiled.

Usage: check_examples.py --source-dir DIR --cxx COMPILER [--flag=F ...] [--keep DIR]
Exit status 0 when every example compiles; the summary line counts compiled and ignored
blocks per source.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

STD_HEADERS = ["cstdint", "cstdio", "iostream", "memory", "span", "string", "string_view", "vector"]
README_DEFAULT_HEADERS = ["tlm/generate.hpp", "tlm/configs.hpp", "tlm/train/trainer.hpp"]
KINDS = ("body", "file", "members", "ignore")

MARKER = re.compile(r"^\s*// Example(?: \((?P<kind>file|members|ignore)(?:: [^)]*)?\))?(?:, given (?P<given>.+?))?:\s*$")
HEADER_LINE = re.compile(r"^\s*//(?:   (?P<code>.*)|\s*)$")
LOOKS_LIKE_CODE = re.compile(r"^\s*//\s{2,}.*\btlm::\w+.*[;{]\s*(?://.*)?$")
INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]")


class Block:
    def __init__(self, source, line, kind, given, lines):
        self.source = source      # path relative to the source dir, for messages
        self.line = line          # 1-based line of the block's first code line
        self.kind = kind
        # A declaration list may leave out its last ';'.
        given = (given or "").strip()
        self.given = given + ";" if given and not given.endswith((";", "}")) else given
        self.lines = lines        # the code, one string per line of the source


def parse_readme(path, rel):
    blocks, problems = [], []
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    i = 0
    while i < len(text):
        m = re.match(r"^```(\S*)\s*(.*)$", text[i])
        if not m:
            i += 1
            continue
        lang, rest = m.group(1), m.group(2).strip()
        start = i + 1
        j = start
        while j < len(text) and text[j].strip() != "```":
            j += 1
        if j == len(text):
            problems.append(f"{rel}:{i + 1}: a fenced block that is never closed")
            break
        if lang in ("cpp", "c++"):
            kind, given = "body", None
            words = rest.split(" ", 1) if rest else []
            if words and words[0] in KINDS[1:]:
                kind = words[0]
                rest = words[1] if len(words) > 1 else ""
            if rest.startswith("given "):
                given = rest[len("given "):]
            elif rest:
                problems.append(f"{rel}:{i + 1}: unknown words after ```{lang}: '{rest}' "
                                f"(known: file, members, ignore, given DECLS)")
            blocks.append(Block(rel, start + 1, kind, given, text[start:j]))
        i = j + 1
    return blocks, problems


def parse_header(path, rel):
    blocks, problems = [], []
    with open(path, encoding="utf-8") as f:
        text = f.read().split("\n")
    inside = set()
    i = 0
    while i < len(text):
        m = MARKER.match(text[i])
        if not m:
            i += 1
            continue
        kind = m.group("kind") or "body"
        j = i + 1
        lines = []
        while j < len(text):
            h = HEADER_LINE.match(text[j])
            if not h:
                break
            lines.append(h.group("code") or "")
            j += 1
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            problems.append(f"{rel}:{i + 1}: '// Example' with no '//   ' lines under it")
        inside.update(range(i + 1, i + 1 + len(lines)))
        blocks.append(Block(rel, i + 2, kind, m.group("given"), lines))
        i = j
    for n, line in enumerate(text):
        if n not in inside and LOOKS_LIKE_CODE.match(line):
            problems.append(f"{rel}:{n + 1}: this comment line looks like a code example, but no "
                            f"'// Example:' line marks it, so nothing compiles it: mark the block "
                            f"(see docs/check_examples.py)")
    return blocks, problems


def translation_unit(blocks, headers):
    out = ["// Generated by docs/check_examples.py: the examples of one source, one namespace each."]
    out += [f"#include <{h}>" for h in STD_HEADERS]
    seen = set()
    for h in headers:
        if h not in seen:
            seen.add(h)
            out.append(f"#include <{h}>")
    for k, b in enumerate(blocks):
        if b.kind == "ignore":
            continue
        # A whole file's declarations stay at global scope, where `main` is the program's.
        if b.kind != "file":
            out.append(f"namespace tlm_example_{k} {{")
        if b.given:
            out.append(f'#line {b.line - 1} "{b.source}"')
            out.append(b.given)
        opener = {"body": "[[maybe_unused]] inline auto example() {",
                  "members": "struct example {", "file": ""}[b.kind]
        closer = {"body": "}", "members": "};", "file": ""}[b.kind]
        out.append(opener)
        for n, line in enumerate(b.lines):
            if INCLUDE.match(line):
                continue
            out.append(f'#line {b.line + n} "{b.source}"')
            out.append(line)
        out.append(closer)
        if b.kind != "file":
            out.append(f"}}  // namespace tlm_example_{k}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--cxx", required=True)
    ap.add_argument("--flag", action="append", default=[])
    ap.add_argument("--keep", help="write the translation units here (default: a temporary folder)")
    args = ap.parse_args()
    root = args.source_dir

    sources = [("README.md", *parse_readme(os.path.join(root, "README.md"), "README.md"))]
    include_root = os.path.join(root, "include")
    for d, _, files in sorted(os.walk(include_root)):
        for f in sorted(files):
            if f.endswith(".hpp"):
                rel = os.path.relpath(os.path.join(d, f), root)
                sources.append((rel, *parse_header(os.path.join(d, f), rel)))

    problems = [p for _, _, ps in sources for p in ps]
    failed = []
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        for rel, blocks, _ in sources:
            if not blocks:
                continue
            compiled = [b for b in blocks if b.kind != "ignore"]
            ignored = len(blocks) - len(compiled)
            counts.append(f"{rel}: {len(compiled)} compiled, {ignored} ignored")
            if not compiled:
                continue
            if rel == "README.md":
                headers = []
                for b in compiled:
                    own = [INCLUDE.match(line).group(1) for line in b.lines if INCLUDE.match(line)]
                    headers += own
                    if not any(h.startswith("tlm/") for h in own):
                        headers += README_DEFAULT_HEADERS
            else:
                headers = [os.path.relpath(os.path.join(root, rel), include_root)]
                headers += [INCLUDE.match(line).group(1) for b in compiled for line in b.lines if INCLUDE.match(line)]
            tu = os.path.join(out_dir, re.sub(r"[^A-Za-z0-9]+", "_", rel) + ".cpp")
            with open(tu, "w", encoding="utf-8") as f:
                f.write(translation_unit(blocks, headers))
            # The #line names are relative to the source dir: compile from there.
            r = subprocess.run([args.cxx, *args.flag, "-fsyntax-only", tu], cwd=root,
                               capture_output=True, text=True)
            if r.returncode != 0:
                failed.append(rel)
                sys.stdout.write(f"--- {rel}: an example does not compile ({tu}):\n{r.stdout}{r.stderr}\n")
    n_compiled = sum(1 for _, bs, _ in sources for b in bs if b.kind != "ignore")
    n_ignored = sum(1 for _, bs, _ in sources for b in bs if b.kind == "ignore")
    for c in counts:
        print(c)
    print(f"examples: {n_compiled} compiled, {n_ignored} marked ignore, "
          f"{len(failed)} sources failing, {len(problems)} marking problems")
    for p in problems:
        print(p)
    if failed or problems:
        print("examples: FAILED (" + ", ".join(failed + ([f"{len(problems)} marking problems"] if problems else [])) + ")")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
