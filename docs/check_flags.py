#!/usr/bin/env python3
"""Keeps the README's flags true of the programs: every flag a program's --help lists is
described in the program's part of the README, and every flag the README's flag tables
name is one the program takes.

The parts: generate's paragraph (from "`generate [--model" to train's synopsis), train's
table (from "`train (--model" to the first line after it that is not a table row) and
serve's table (the rows of "### The HTTP server"). A flag counts as described when it
stands in backticks at the start of a code span (`--top-k K`, `--kv-type f32|q8`): in
generate's paragraph anywhere, in a table in the first cell of a row.

Usage: check_flags.py SOURCE_DIR EXAMPLES_DIR
"""
import os
import re
import subprocess
import sys

root, examples = sys.argv[1], sys.argv[2]
with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
    readme = f.read()


def help_flags(program):
    """The flags with a line of their own in --help (-h and --help aside), and every flag
    its text names (an alias such as serve's --slots is named in its option's help)."""
    out = subprocess.run([os.path.join(examples, program), "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    own = set(re.findall(r"^ {2}(--?[a-z][a-z0-9-]*)", text, re.M)) - {"-h", "--help"}
    return own, set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", text))


def section(start, end_pattern):
    at = readme.find(start)
    if at < 0:
        sys.exit(f"README.md: no '{start}' to find {start!r}'s flags under")
    m = re.compile(end_pattern, re.M).search(readme, at + len(start))
    return readme[at:m.start() if m else len(readme)]


def described(text):
    return set(re.findall(r"`(--?[a-z][a-z0-9-]*)", text))


def table_flags(text):
    """The flags in the first cell of each table row."""
    flags = set()
    for line in text.split("\n"):
        if line.startswith("| `-"):
            flags |= described(line.split(" | ")[0])
    return flags


parts = {
    "generate": section("`generate [--model", r"^`train \(--model"),
    "train": section("`train (--model", r"^(?!\|)(?!`train)\S"),
    "serve": section("### The HTTP server", r"^### "),
}
problems = []
for program, text in parts.items():
    have, named = help_flags(program)
    # A table describes a flag in a row of its own (first cell); generate's paragraph anywhere.
    told = described(text) if program == "generate" else table_flags(text)
    if not have:
        problems.append(f"{program} --help listed no flags")
    for flag in sorted(have - told):
        problems.append(f"README.md: {program}'s {flag} (in {program} --help) is not described in its part of the README")
    if program != "generate":
        for flag in sorted(table_flags(text) - named):
            problems.append(f"README.md: {program}'s table names {flag}, which {program} --help does not list")
    print(f"{program}: {len(have)} flags in --help, {len(have & told)} described")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
