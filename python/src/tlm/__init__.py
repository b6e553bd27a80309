"""tlm: typed Llama models (header-only C++20), from Python.

    import tlm
    model = tlm.Model("SmolLM2-135M-Instruct.Q4_1.gguf", threads=2)   # model.config: 'smollm2_135m', from the file
    model.generate("The capital of France is", max_tokens=8)          # ' Paris.\\n\\nThe answer is:'
    for piece in model.generate("Once upon a time", max_tokens=32, stream=True):
        print(piece, end="")
    model.chat([{"role": "user", "content": "What is the capital of France?"}])
    model.logits(model.tokenize("Hello"))                             # numpy float32 [positions, vocab]
    tlm.Model(path, lora="adapter.gguf")                              # or lora=[("a.gguf", 0.5), "b.gguf"]
    tlm.train(model="SmolLM2-135M-Instruct.Q4_1.gguf", data="notes.txt", steps=100, out="run1")
    t = tlm.Trainer(config="tiny_train", data="notes.txt", steps=50, out="run2")
    for report in t:                                                  # one optimizer step each
        print(report["step"], report["loss"])
    t.finish()                                                        # checkpoint, run2/model.gguf

The sampling keywords of generate() and chat() (temperature, top_k, top_p, min_p, the
penalties, penalty_window, logit_bias, seed) are those of generate's flags and the server's
fields, read from one table in the C++ library; tlm._sampling_options() lists each with
its kind, range, default and help. The training keywords of tlm.Trainer and tlm.train are
examples/train's flags, read from the library's table of them (tlm._training_options()).

tlm.Llama is llama-cpp-python's Llama interface over tlm.Model (Llama(model_path=...,
n_ctx=...), create_completion, create_chat_completion, __call__, OpenAI-shaped dicts), so
code written for llama-cpp-python runs unchanged.

Errors from the C++ library (a file that does not fit its config, bad options, a
prompt too long) are raised as tlm.Error with the library's message.
"""
from ._tlm import Error, Model, TextStream, Trainer, _sampling_options, _training_options
from ._llama import Llama
from ._train import train

__all__ = ["Error", "Llama", "Model", "TextStream", "Trainer", "train"]
