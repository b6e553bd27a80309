"""tlm.Llama: the surface of llama-cpp-python's Llama class over tlm.Model.

Code written for llama-cpp-python runs unchanged with `from tlm import Llama`:

    llm = Llama(model_path="SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=2048, seed=1)
    llm("The capital of France is", max_tokens=16, stop=["."])["choices"][0]["text"]
    llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])["choices"][0]["message"]

The defaults are llama-cpp-python 0.3's (completion: max_tokens 16, temperature 0.8,
top_k 40, top_p 0.95, min_p 0.05; chat: temperature 0.2, max_tokens up to n_ctx; the
penalties look at the last 64 tokens), and so are the shapes of the results (OpenAI's
text_completion, chat.completion and their stream chunks) and the prompt's tokens (a
text prompt with the file's BOS and special tokens parsed; a list of ids as given).
tools and tool_choice are OpenAI's, written in Qwen2.5's (Hermes) form for every
template, with the reply held to a valid call (llama-cpp-python's own tool support
depends on its chat_format). The numbers are tlm's (f32 activations): a greedy run gives tlm.Model's text, which follows
llama.cpp's until a near-tie that llama.cpp's int8 activations and f16 cache decide the
other way (tested against llama-cpp-python on the same file).

What is not there is refused by name rather than ignored: an option that would change
the result (typical_p, tfs_z, mirostat, logprobs, suffix, grammar objects, logits
processors, the legacy functions/function_call, RoPE overrides, ...) raises tlm.Error
saying what to use instead; a keyword llama-cpp-python does not have raises TypeError. Options that only tune
llama.cpp's speed or memory (n_gpu_layers, n_batch, use_mmap, flash_attn, ...) are
accepted and have no effect: tlm maps the file and sizes its caches itself.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Union

from ._tlm import Error, Model

# llama.cpp's "no seed given": a fresh random one.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# Keywords of llama-cpp-python's Llama() that tune speed, memory or devices only.
_NO_EFFECT = {
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "use_mmap", "use_mlock", "n_batch", "n_ubatch",
    "n_threads_batch", "offload_kqv", "flash_attn", "op_offload", "swa_full", "no_perf", "numa", "logits_all",
    "embedding", "type_k", "type_v",
}
# Keywords of Llama() that would change results, with their no-op values.
_UNSUPPORTED_INIT = {
    "vocab_only": False, "kv_overrides": None, "rope_scaling_type": -1, "pooling_type": -1, "attention_type": -1,
    "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0,
    "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0, "lora_base": None, "chat_handler": None,
    "draft_model": None, "tokenizer": None, "spm_infill": False,
}


def _refuse(name: str, why: str) -> Error:
    return Error(f"tlm.Llama: {name} is not supported ({why})")


def _check_unsupported(options: Dict[str, Any], defaults: Dict[str, Any], instead: Dict[str, str]) -> None:
    for name, default in defaults.items():
        if name in options and options[name] != default and options[name] is not None:
            raise _refuse(name, instead.get(name, f"leave it at {default!r}"))


_SAMPLING_UNSUPPORTED = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0, "stopping_criteria": None,
                         "logits_processor": None, "grammar": None}
_SAMPLING_INSTEAD = {
    "grammar": "give JSON output as response_format={'type': 'json_object', 'schema': {...}} in a chat, "
               "or tlm.Model.generate(json_schema=...)",
    "stopping_criteria": "use stop strings",
    "logits_processor": "use logit_bias, or tlm.Model.logits for your own loop",
}


class Llama:
    """A GGUF model with llama-cpp-python's Llama interface, run by tlm (see the module's doc)."""

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_threads: Optional[int] = None,
                 seed: int = LLAMA_DEFAULT_SEED, lora_path: Optional[str] = None, lora_scale: float = 1.0,
                 chat_format: Optional[str] = None, last_n_tokens_size: int = 64, verbose: bool = True,
                 config: Optional[str] = None, **options: Any):
        for name in options:
            if name not in _NO_EFFECT and name not in _UNSUPPORTED_INIT:
                raise TypeError(f"Llama() got an unexpected keyword argument '{name}'")
        _check_unsupported(options, _UNSUPPORTED_INIT,
                           {"chat_handler": "give chat_format, one of tlm's template names",
                            "kv_overrides": "tlm reads the file's own values"})
        if n_ctx < 0:
            raise Error(f"tlm.Llama: n_ctx={n_ctx}; give 0 (the model's context) or a positive number of positions")
        self.model_path = os.fspath(model_path)
        lora = None if lora_path is None else (os.fspath(lora_path), lora_scale)
        self._model = Model(self.model_path, config=config or "", threads=n_threads or 0, lora=lora)
        context = self._model.context
        if n_ctx > context and verbose:
            print(f"tlm.Llama: n_ctx={n_ctx} is more than the model's context of {context}; using {context}",
                  file=sys.stderr)
        self._n_ctx = context if n_ctx == 0 else min(n_ctx, context)
        self._rng = random.Random(None if seed == LLAMA_DEFAULT_SEED else seed)
        self._window = last_n_tokens_size
        self.chat_format = chat_format
        self.verbose = verbose

    @property
    def model(self) -> Model:
        """The tlm.Model underneath, for what llama-cpp-python has no name for."""
        return self._model

    def n_ctx(self) -> int:
        return self._n_ctx

    def n_vocab(self) -> int:
        return self._model.vocab_size

    def token_eos(self) -> int:
        return self._model.eos

    def token_bos(self) -> int:
        return self._model.bos

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        return self._model.tokenize(text.decode("utf-8"), special=special, add_bos=add_bos)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False) -> bytes:
        # A character split across tokens comes out as U+FFFD (tlm.Model.detokenize gives
        # text), where llama.cpp gives the raw bytes.
        tokens = list(tokens)
        if not prev_tokens:
            return self._model.detokenize(tokens, special=special).encode("utf-8")
        # The text the tokens add after prev_tokens, as llama-cpp-python's offset mapping.
        before = self._model.detokenize(list(prev_tokens), special=special)
        whole = self._model.detokenize(list(prev_tokens) + tokens, special=special)
        text = whole[len(before):] if whole.startswith(before) else self._model.detokenize(tokens, special=special)
        return text.encode("utf-8")

    def __call__(self, prompt: Union[str, List[int]], **kwargs: Any):
        return self.create_completion(prompt, **kwargs)

    # Sampling keywords shared by both calls, mapped onto tlm's table.
    def _sampling(self, temperature, top_p, min_p, top_k, repeat_penalty, frequency_penalty, presence_penalty,
                  seed, logit_bias, extra: Dict[str, Any]) -> Dict[str, Any]:
        _check_unsupported(extra, _SAMPLING_UNSUPPORTED, _SAMPLING_INSTEAD)
        return {
            "temperature": max(float(temperature), 0.0),
            "top_k": max(int(top_k), 0),  # llama.cpp: 0 or less keeps every token
            "top_p": float(top_p) if top_p > 0 else 1.0,
            "min_p": float(min_p),
            "repeat_penalty": float(repeat_penalty) if repeat_penalty > 0 else 1.0,
            "frequency_penalty": float(frequency_penalty),
            "presence_penalty": float(presence_penalty),
            "penalty_window": self._window,
            "seed": int(seed) if seed is not None else self._rng.getrandbits(64),
            "logit_bias": None if not logit_bias else {int(k): float(v) for k, v in logit_bias.items()},
        }

    def _budget(self, prompt_tokens: int, max_tokens: Optional[int]) -> int:
        if prompt_tokens > self._n_ctx:
            raise ValueError(f"Requested tokens ({prompt_tokens}) exceed context window of {self._n_ctx}")
        room = self._n_ctx - prompt_tokens
        return room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)

    @staticmethod
    def _finish(reason: str) -> str:
        if reason == "tool_calls":
            return reason
        return "length" if reason in ("length", "context_full") else "stop"

    @staticmethod
    def _usage(r: Dict[str, Any]) -> Dict[str, int]:
        # llama.cpp does not count the end-of-generation token it stopped at.
        completion = r["completion_tokens"] - (1 if r["finish_reason"] == "eos" and r["completion_tokens"] > 0 else 0)
        return {"prompt_tokens": r["prompt_tokens"], "completion_tokens": completion,
                "total_tokens": r["prompt_tokens"] + completion}

    def create_completion(self, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: Optional[int] = None,
                          echo: bool = False, stop: Optional[Union[str, List[str]]] = None,
                          frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                          top_k: int = 40, stream: bool = False, seed: Optional[int] = None, tfs_z: float = 1.0,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          model: Optional[str] = None, stopping_criteria=None, logits_processor=None, grammar=None,
                          logit_bias: Optional[Dict[int, float]] = None):
        if suffix is not None:
            raise _refuse("suffix", "tlm has no fill-in-the-middle mode")
        if logprobs is not None:
            raise _refuse("logprobs", "tlm.Model.logits(ids) gives every position's logits")
        sampling = self._sampling(temperature, top_p, min_p, top_k, repeat_penalty, frequency_penalty,
                                  presence_penalty, seed, logit_bias,
                                  {"typical_p": typical_p, "tfs_z": tfs_z, "mirostat_mode": mirostat_mode,
                                   "stopping_criteria": stopping_criteria, "logits_processor": logits_processor,
                                   "grammar": grammar})
        # As llama-cpp-python: a text is tokenized with the file's BOS and its special
        # tokens parsed; a list of ids runs as given.
        ids = self._model.tokenize(prompt, special=True, add_bos=True) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise Error("tlm.Llama: the prompt is empty; give some text")
        budget = self._budget(len(ids), max_tokens)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": model or self.model_path}
        echoed = self.detokenize(ids).decode("utf-8", errors="replace") if echo else ""
        if budget == 0:
            # No room: llama.cpp ends at once with "length", having generated nothing.
            done = {"text": "", "ids": [], "finish_reason": "length", "prompt_tokens": len(ids), "completion_tokens": 0}
            return self._completion(head, echoed, done) if not stream else iter([self._chunk(head, "", "length")])
        run = self._model.generate(ids, max_tokens=budget, stop=stop or None, stream=stream, details=not stream,
                                   **sampling)
        if not stream:
            return self._completion(head, echoed, run)
        return self._completion_chunks(head, echoed, run)

    @staticmethod
    def _completion(head: Dict[str, Any], echoed: str, r: Dict[str, Any]) -> Dict[str, Any]:
        return {**head,
                "choices": [{"text": echoed + r["text"], "index": 0, "logprobs": None,
                             "finish_reason": Llama._finish(r["finish_reason"])}],
                "usage": Llama._usage(r)}

    @staticmethod
    def _chunk(head: Dict[str, Any], text: str, finish: Optional[str]) -> Dict[str, Any]:
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

    def _completion_chunks(self, head, echoed, stream) -> Iterator[Dict[str, Any]]:
        if echoed:
            yield self._chunk(head, echoed, None)
        for piece in stream:
            yield self._chunk(head, piece, None)
        result = stream.result
        yield self._chunk(head, "", self._finish(result["finish_reason"]) if result else "stop")

    def create_chat_completion(self, messages: List[Dict[str, Any]], functions=None, function_call=None,
                               tools=None, tool_choice=None, temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: Optional[Union[str, List[str]]] = None, seed: Optional[int] = None,
                               response_format: Optional[Dict[str, Any]] = None, max_tokens: Optional[int] = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: Optional[str] = None,
                               logits_processor=None, grammar=None, logit_bias: Optional[Dict[int, float]] = None,
                               logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None):
        for name, value in (("functions", functions), ("function_call", function_call)):
            if value is not None:
                raise _refuse(name, "give tools and tool_choice, OpenAI's newer fields for it")
        choice = self._tool_choice(tools, tool_choice)
        if logprobs or top_logprobs:
            raise _refuse("logprobs", "tlm.Model.logits(ids) gives every position's logits")
        sampling = self._sampling(temperature, top_p, min_p, top_k, repeat_penalty, frequency_penalty,
                                  presence_penalty, seed, logit_bias,
                                  {"typical_p": typical_p, "tfs_z": tfs_z, "mirostat_mode": mirostat_mode,
                                   "logits_processor": logits_processor, "grammar": grammar})
        schema = self._schema(response_format)
        template = None if self.chat_format is None else self.chat_format.replace("-", "")
        prompt = self._model.chat_tokens(messages, chat_template=template, tools=tools, tool_choice=choice)
        budget = self._budget(len(prompt), max_tokens)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": model or self.model_path}
        if budget == 0:
            r = {"text": "", "finish_reason": "length", "prompt_tokens": len(prompt), "completion_tokens": 0}
            return self._chat(head, r) if not stream else self._chat_chunks(head, iter(()), r)
        run = self._model.chat(messages, max_tokens=budget, stop=stop or None, stream=stream, details=not stream,
                               json_schema=schema, chat_template=template, tools=tools, tool_choice=choice,
                               **sampling)
        return self._chat(head, run) if not stream else self._chat_chunks(head, run, None)

    @staticmethod
    def _tool_choice(tools, tool_choice) -> str:
        """OpenAI's tool_choice as tlm.Model.chat takes it: auto, required, none or a name."""
        if tool_choice is None:
            return "auto"
        if isinstance(tool_choice, str):
            return tool_choice
        if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict) \
                and isinstance(tool_choice["function"].get("name"), str):
            return tool_choice["function"]["name"]
        raise Error("tlm.Llama: tool_choice must be 'auto', 'required', 'none' or "
                    "{'type': 'function', 'function': {'name': ...}}")

    @staticmethod
    def _calls(r: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
        calls = r.get("tool_calls")
        if not calls:
            return None
        return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]

    @staticmethod
    def _schema(response_format: Optional[Dict[str, Any]]):
        if not response_format or response_format.get("type") == "text":
            return None
        kind = response_format.get("type")
        if kind == "json_object":
            schema = response_format.get("schema")
        elif kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
        else:
            raise Error(f"tlm.Llama: response_format type {kind!r}; give 'text', 'json_object' or 'json_schema'")
        return True if schema is None else json.dumps(schema)

    @staticmethod
    def _chat(head: Dict[str, Any], r: Dict[str, Any]) -> Dict[str, Any]:
        calls = Llama._calls(r)
        message = {"role": "assistant", "content": r["text"]} if not calls else \
            {"role": "assistant", "content": None, "tool_calls": calls}
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": Llama._finish(r["finish_reason"])}],
                "usage": Llama._usage(r)}

    def _chat_chunks(self, head, pieces, done) -> Iterator[Dict[str, Any]]:
        def chunk(delta: Dict[str, Any], finish: Optional[str]) -> Dict[str, Any]:
            return {**head, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        yield chunk({"role": "assistant"}, None)
        # Text that is, or may still become, a tool call is held back: a call is sent whole,
        # as one tool_calls delta, once it is complete.
        trigger, held = "<tool_call>", ""
        for piece in pieces:
            held += piece
            if held.startswith(trigger) or trigger.startswith(held):
                continue
            yield chunk({"content": held}, None)
            held = ""
        result = done if done is not None else pieces.result
        calls = self._calls(result) if result else None
        if calls:
            yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}, None)
        elif held:
            yield chunk({"content": held}, None)
        yield chunk({}, self._finish(result["finish_reason"]) if result else "stop")
