#pragma once
// The high-level API an application embeds: a generator for one prompt and a chat
// session that keeps the conversation in the KV cache. The examples are thin layers
// over these; the decoding loop exists once, in generation/decode.hpp.
//
// Example, given std::string path:
//   auto m = tlm::model<tlm::smollm2_135m>::load(path);
//   auto tok = tlm::tokenizer::from_gguf(m.file());
//   tlm::generator gen(m, tok);
//   auto r = gen.generate("The capital of France is", {.max_tokens = 16},
//       tlm::make_token_callback([](std::int32_t, std::string_view text) { std::fputs(std::string(text).c_str(), stdout); }));
//
//   tlm::chat_session chat(m, tok);
//   chat.add("user", "What is the capital of France?");
//   auto answer = chat.reply({.max_tokens = 64});
//
// The parts, each its own header (include one alone to take only it):
//   generation/decode.hpp        options, result, streaming callback, decode_state and the loop
//   generation/generator.hpp     generator: one prompt at a time
//   generation/beam.hpp          generate_beam: beam search
//   generation/chat_session.hpp  chat_session: a conversation kept in the KV cache
#include <tlm/generation/beam.hpp>
#include <tlm/generation/chat_session.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/generation/generator.hpp>
