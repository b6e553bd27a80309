#!/usr/bin/env python3
"""Drives the interactive `generate --chat` through a pipe with more turns than its small
cache (--ctx 128) holds. With --context-shift every question is answered and the
shift is reported on stderr; without it, the conversation that no longer fits is an
error naming --context-shift, after which the chat starts over and goes on.

usage: chat_shift.py GENERATE MODEL
"""
import subprocess
import sys

QUESTIONS = [
    "What is the capital of France?",
    "Name a large animal.",
    "What colour is the sky?",
    "How many legs does a spider have?",
    "What do bees make?",
    "Name a planet.",
    "What is two plus two?",
    "Name a fruit that is yellow.",
]


def chat(generate: str, model: str, *flags: str) -> subprocess.CompletedProcess:
    stdin = "\n".join(QUESTIONS) + "\n/quit\n"
    return subprocess.run(
        [generate, "--model", model, "--chat", "--ctx", "128", "-n", "24", "--system", "Answer in one sentence.", *flags],
        input=stdin, capture_output=True, text=True, timeout=900)


def main() -> int:
    generate, model = sys.argv[1], sys.argv[2]
    problems = []

    for kv in ("f32", "q8"):
        r = chat(generate, model, "--context-shift", "--kv-type", kv)
        replies = r.stdout.count("> ") - 1  # one prompt per question, and one before /quit
        if r.returncode != 0:
            problems.append(f"--context-shift --kv-type {kv}: exit status {r.returncode}")
        if replies != len(QUESTIONS):
            problems.append(f"--context-shift --kv-type {kv}: {replies} prompts answered, wanted {len(QUESTIONS)}")
        if "context shift: the oldest turns" not in r.stderr:
            problems.append(f"--context-shift --kv-type {kv}: no shift reported on stderr")
        if "no longer fits" in r.stdout or "positions but the cache holds" in r.stderr:
            problems.append(f"--context-shift --kv-type {kv}: the conversation still overflowed")
        print(f"--- --context-shift --kv-type {kv}: stdout\n{r.stdout}\n--- stderr\n{r.stderr}")

    r = chat(generate, model)
    if r.returncode != 0:
        problems.append(f"without --context-shift: exit status {r.returncode}")
    if "positions but the cache holds 128" not in r.stderr or "--context-shift" not in r.stderr:
        problems.append("without --context-shift: no capacity error naming --context-shift on stderr")
    if "the conversation no longer fits the cache; it starts over" not in r.stdout:
        problems.append("without --context-shift: the chat did not start over")
    print(f"--- without --context-shift: stdout\n{r.stdout}\n--- stderr\n{r.stderr}")

    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
