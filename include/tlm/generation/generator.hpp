#pragma once
// generator: continuations of one prompt at a time, each from an empty cache.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/kv.hpp>
#include <tlm/model.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

// Generates continuations of one prompt at a time. Each call starts from an empty
// cache, sized to the prompt plus max_tokens (grown when a later call needs more).
template <LlamaConfig C>
class generator {
 public:
  // kv: the element type of the generator's cache (kv.hpp); q8 takes 3.76x less
  // memory per position at a small logit error (README, "Long conversations").
  generator(model<C>& m, const tokenizer& tok, kv_type kv = kv_type::f32) : m_(&m), tok_(&tok), cache_(1, kv) {}

  // The prompt is text, tokenized without special tokens (parse_special makes
  // "<|im_start|>" in it a token, for prompts rendered by hand), with BOS/EOS as the
  // file's add_bos_token / add_eos_token say, as llama.cpp does.
  generation_result generate(std::string_view prompt, const generation_options& o = {}, token_callback on_token = {},
                             bool parse_special = false) {
    const auto ids = tok_->encode(prompt, {.parse_special = parse_special});
    return generate(std::span<const std::int32_t>(ids), o, std::move(on_token));
  }

  generation_result generate(std::span<const std::int32_t> prompt, const generation_options& o = {},
                             token_callback on_token = {}, const generation_hooks<C>& hooks = {}) {
    detail::check_options(o);
    if (prompt.empty()) throw error("generate: the prompt is empty after tokenization; give some text");
    if (prompt.size() > C::context)
      throw capacity_error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                           std::to_string(C::context) + " positions; shorten it");
    // The last sampled token is never run, so the prompt plus max_tokens - 1 positions
    // suffice; past the context, generation ends with stop_reason::context_full.
    const std::size_t needed = std::min(prompt.size() + std::max<std::size_t>(o.max_tokens, 1) - 1, C::context);
    if (cache_.capacity() < needed) cache_ = kv_cache<C>(needed, cache_.type());
    cache_.clear();
    generation_result r;
    r.prompt_tokens = prompt.size();
    const auto t0 = std::chrono::steady_clock::now();
    const auto logits = m_->prefill(prompt, cache_, hooks.prompt_logits);
    r.prefill_ms = detail::ms_since(t0);
    std::vector<std::int32_t> context(prompt.begin(), prompt.end());
    detail::decode(*m_, *tok_, cache_, logits, context, o, tok_->end_of_generation(), on_token, hooks, r);
    return r;
  }

  const kv_cache<C>& cache() const { return cache_; }

 private:
  model<C>* m_;
  const tokenizer* tok_;
  kv_cache<C> cache_{1};
};

}  // namespace tlm
