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

The sampling keywords of generate() and chat() (temperature, top_k, top_p, min_p, the
penalties, penalty_window, logit_bias, seed) are those of generate's flags and the server's
fields, read from one table in the C++ library; tlm._sampling_options() lists each with
its kind, range, default and help.

Errors from the C++ library (a file that does not fit its config, bad options, a
prompt too long) are raised as tlm.Error with the library's message.
"""
from ._tlm import Error, Model, TextStream, _sampling_options
from ._train import train

__all__ = ["Error", "Model", "TextStream", "train"]
