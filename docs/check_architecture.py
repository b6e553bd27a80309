#!/usr/bin/env python3
"""Keeps docs/architecture.md true of the tree it describes.

Fails when a path the page names (in backticks: `include/tlm/kv.hpp`, `examples/`,
`tests/test_*.cpp`) does not exist in the repository, or when a header under
include/tlm/ is not named on the page by its path. Paths outside the repository
(starting with ../) are not checked.

Usage: check_architecture.py SOURCE_DIR
"""
import glob
import os
import re
import sys

root = sys.argv[1]
page = os.path.join(root, "docs", "architecture.md")
with open(page, encoding="utf-8") as f:
    text = f.read()

problems = []
named = set()
# A path: a backticked word with a slash or a file extension, no spaces.
for n, line in enumerate(text.split("\n"), 1):
    for token in re.findall(r"`([^`\s]+)`", line):
        if token.startswith("../") or not ("/" in token or re.search(r"\.(hpp|cpp|py|md|txt|sh)$", token)):
            continue
        if "=" in token or "::" in token or token.startswith("<"):
            continue   # an environment setting or a C++ name, not a path
        matches = glob.glob(os.path.join(root, token.rstrip("/")))
        # A bare file name (`block.hpp`) may stand for the header of that name.
        if not matches and "/" not in token:
            matches = glob.glob(os.path.join(root, "include", "tlm", "**", token), recursive=True)
        if not matches:
            problems.append(f"docs/architecture.md:{n}: `{token}` names no file or folder of the repository")
        named.update(os.path.normpath(os.path.relpath(m, root)) for m in matches)

for header in sorted(glob.glob(os.path.join(root, "include", "tlm", "**", "*.hpp"), recursive=True)):
    rel = os.path.normpath(os.path.relpath(header, root))
    if rel not in named:
        problems.append(f"docs/architecture.md: {rel} is not named on the page: add a line saying what it is for")

for p in problems:
    print(p)
print(f"docs/architecture.md: {len(named)} paths named, {len(problems)} problems")
sys.exit(1 if problems else 0)
