"""tlm.train: the trainer of examples/train, from Python.

The training loop (data, AdamW, atomic checkpoints, resume, SIGINT, exports, MPI) lives in
the `train` program, which the wheel installs beside this module; tlm.train runs it with
the same options, so a run from Python and one from the shell are the same run, bit for
bit. Its output lines reach `on_line` as they come (default: printed).
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Optional

from ._tlm import Error

# Every option of examples/train, as keyword arguments: value options take their value
# (a string or a number), the switches take True. Names use '_' where the flag has '-'.
_VALUE_OPTIONS = ("model", "config", "data", "steps", "epochs", "batch", "accumulate", "seq", "lr", "min_lr", "warmup", "clip",
                  "weight_decay", "held_out", "eval_every", "save_every", "out", "out_type", "threads", "seed",
                  "stop_after", "keep_checkpoints", "lora", "lora_alpha", "lora_targets")
_SWITCHES = ("chat", "resume", "overwrite", "recompute", "pack", "merge")


def train_executable() -> Path:
    """The `train` program run by train(): $TLM_TRAIN if set, else the one in the wheel."""
    env = os.environ.get("TLM_TRAIN")
    exe = Path(env) if env else Path(__file__).resolve().parent / "bin" / "train"
    if not exe.is_file():
        raise Error(f"tlm.train: the train program is missing at {exe}; reinstall the package (pip install ./python) "
                    "or point TLM_TRAIN at a built examples/train")
    return exe


def train_arguments(**options) -> list[str]:
    """The command line of examples/train for these options (see train())."""
    args = []
    for name, value in options.items():
        if name in _SWITCHES:
            if not isinstance(value, bool):
                raise TypeError(f"tlm.train: {name} is a switch; pass True or False, not {value!r}")
            if value:
                args.append("--" + name)
        elif name in _VALUE_OPTIONS:
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int, float, os.PathLike)):
                raise TypeError(f"tlm.train: {name} takes a number, a string or a path, not {value!r}")
            args += ["--" + name.replace("_", "-"), os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
        else:
            known = ", ".join(sorted(_VALUE_OPTIONS + _SWITCHES))
            raise TypeError(f"tlm.train: unknown option {name!r}; the options are {known}")
    return args


def train(*, on_line: Optional[Callable[[str], None]] = print, **options) -> dict:
    """Trains or fine-tunes a model as `examples/train` does, with the same options:

        tlm.train(model="SmolLM2-135M-Instruct.Q4_1.gguf", data="notes.txt", steps=100, lr=1e-4,
                  out="run1", out_type="q4_1", threads=2)
        tlm.train(config="tiny_train", data="text.txt", steps=300, out="scratch")

    Returns {"out": Path, "model": Path of the exported model.gguf, "losses": [{"step",
    "loss", "held_out_loss", "lr", "grad_norm", "tokens_per_s"}, ...]} (from loss.csv;
    held_out_loss is None where it was not evaluated). A refused option or a failed run
    raises tlm.Error with the trainer's message; KeyboardInterrupt stops the trainer as
    Ctrl-C does (it writes a checkpoint, so resume=True continues) and is raised again.
    """
    args = [str(train_executable())] + train_arguments(**options)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if on_line is not None:
                on_line(line.rstrip("\n"))
        stderr = proc.stderr.read() if proc.stderr else ""
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        message = stderr.strip() or f"the train program exited with status {code}"
        raise Error(message)
    out = Path(options.get("out") or "train-out")
    losses = []
    with open(out / "loss.csv", newline="") as f:
        for row in csv.DictReader(f):
            losses.append({"step": int(row["step"]), "loss": float(row["loss"]),
                           "held_out_loss": float(row["held_out_loss"]) if row["held_out_loss"] else None,
                           "lr": float(row["lr"]), "grad_norm": float(row["grad_norm"]),
                           "tokens_per_s": float(row["tokens_per_s"])})
    return {"out": out, "model": out / "model.gguf", "losses": losses}
