#!/usr/bin/env python3
"""Drives `generate --chat` (no prompt: the interactive chat) through a pseudo-terminal,
as a person at a terminal would: a two-turn conversation (the second message typed on two
lines), Ctrl-C during a long reply (it must stop the reply, not the program), /system,
/reset and /quit.

usage: chat_pty.py GENERATE MODEL
"""
import os
import pty
import re
import select
import sys
import time

TIMEOUT = 300.0  # seconds per step; the machine may be busy


def main() -> int:
    generate, model = sys.argv[1], sys.argv[2]
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(generate, [generate, "--model", model, "--chat", "-n", "48"])
    out = bytearray()

    def read_until(pattern: str, what: str) -> str:
        """Reads until `pattern` matches the output since the mark; returns that output."""
        start = len(out)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            text = out[start:].decode("utf-8", "replace")
            if re.search(pattern, text, re.S):
                return text
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out.extend(chunk)
        sys.stderr.write(f"FAIL: {what}: no /{pattern}/ in the output:\n{out[start:].decode('utf-8', 'replace')}\n")
        sys.exit(1)

    def send(text: str) -> None:
        os.write(fd, text.encode())

    read_until(r"> $", "the first prompt")
    send("What is the capital of France?\n")
    turn1 = read_until(r"\n> $", "the reply to turn 1")
    print("turn 1:", turn1.strip())
    if "Paris" not in turn1:
        sys.stderr.write("FAIL: turn 1 does not answer Paris\n")
        return 1
    # The second message on two lines: a trailing backslash continues it.
    send("And what is the capital\\\n")
    read_until(r"\. $", "the continuation prompt")
    send("of Italy?\n")
    turn2 = read_until(r"\n> $", "the reply to turn 2")
    print("turn 2:", turn2.strip())
    if "Rome" not in turn2:
        sys.stderr.write("FAIL: turn 2 does not answer Rome\n")
        return 1
    # Ctrl-C during a long reply: the reply stops, the program asks for the next message.
    send("/system You write very long stories.\n")
    read_until(r"new conversation.*> $", "/system")
    send("Tell me a long story about a dragon.\n")
    read_until(r"dragon\.\r?\n\S+\s+\S+\s+\S+", "the first words of the story")
    os.write(fd, b"\x03")
    stopped = read_until(r"\[stopped\]\s*\n> $", "a stopped reply and a new prompt after Ctrl-C")
    print("after Ctrl-C:", stopped.strip()[-80:])
    send("/reset\n")
    read_until(r"new conversation.*> $", "/reset")
    send("/quit\n")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                sys.stderr.write(f"FAIL: exit status {code} after /quit\n")
                return 1
            print("chat pty check passed")
            return 0
        try:
            if select.select([fd], [], [], 0.5)[0]:
                os.read(fd, 4096)
        except OSError:
            pass
    sys.stderr.write("FAIL: still running after /quit\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
