"""tlm.train: a whole training run through tlm.Trainer, printed as examples/train prints it.

tlm.Trainer is the library's training loop (include/tlm/train/trainer.hpp) bound directly:
the same options (examples/train's flags as keywords, read by one table), the same data,
AdamW, checkpoints, resume and exports, so a run from Python and one from the shell give
the same model.gguf, byte for byte.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Optional

from ._tlm import Trainer


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02}m" if s >= 3600 else f"{s // 60}m{s % 60:02}s"


def step_line(r: dict) -> str:
    """A step's report as examples/train prints it when its output is not a terminal."""
    held = "-" if r["last_held_out"] is None else f"{r['last_held_out']:.4f}"
    return (f"step {r['step']} loss {r['loss']:.6f} held_out {held} lr {r['lr']:.3e} grad_norm {r['grad_norm']:.4f} "
            f"tokens_per_s {r['tokens_per_s']:.0f} eta {_duration(r['eta_seconds'])}")


def train(*, on_step: Optional[Callable[[dict], None]] = None, on_line: Optional[Callable[[str], None]] = print,
          **options) -> dict:
    """Trains or fine-tunes a model as `examples/train` does, with its options as keywords:

        tlm.train(model="SmolLM2-135M-Instruct.Q4_1.gguf", data="notes.txt", steps=100, lr=1e-4,
                  out="run1", out_type="q4_1", threads=2)
        tlm.train(config="tiny_train", data="text.txt", steps=300, out="scratch")

    Equals tlm.Trainer(**options).run(), with progress lines like the CLI's passed to
    on_line (default: printed; None: silent). on_step, if given, receives each step's
    report (a dict) instead of its printed line.

    Returns finish()'s dict plus "out" (a Path) and "losses" (the loss log: step, loss,
    held_out_loss (None where not evaluated), lr, grad_norm, tokens_per_s). A refused
    option is a TypeError (an unknown keyword or a value of the wrong type) or tlm.Error
    (a value out of range, an earlier run in out without resume or overwrite); Ctrl-C
    stops at the next step with a checkpoint (resume=True continues) and raises
    KeyboardInterrupt.
    """
    say = on_line if on_line is not None else (lambda line: None)
    t = Trainer(**options)
    say(f"train: {t.config} {options.get('model') or 'from scratch'}, {t.train_windows} training windows and "
        f"{t.held_out_windows} held-out, {t.total_steps} steps from step {t.steps}, kernels {t.kernel_level}")
    if options.get("resume"):
        say(f"resumed at step {t.steps} (checkpoint loaded in {t.load_seconds:.2f} s)")
    else:
        h0 = t.held_out_loss()
        if not math.isnan(h0):
            say(f"held-out loss before training {h0:.4f}")
    f = t.run(on_step=on_step if on_step is not None else (lambda r: say(step_line(r))))
    if f["saved"]:
        say(f"checkpoint {f['checkpoint']} written (step {f['step']}, {f['save_seconds']:.2f} s)")
    if f["exported"]:
        say(f"exported {f['model']}")
    if f["merged"]:
        say(f"merged the adapter into {f['merged']}")
    if not f["exported"]:
        say(f"stopped at step {f['step']} of {f['total']}; continue with resume=True")
    out = dict(f)
    out["out"] = Path(t.out)
    out["model"] = Path(f["model"]) if f["model"] else None
    out["losses"] = [{"step": x["step"], "loss": x["loss"], "held_out_loss": x["held_out"], "lr": x["lr"],
                      "grad_norm": x["grad_norm"], "tokens_per_s": x["tokens_per_s"]} for x in t.log]
    return out
