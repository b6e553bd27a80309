#pragma once
// Beam search over one prompt, each beam in its own cache.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/kv.hpp>
#include <tlm/model.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

struct beam_options {
  std::size_t width = 4;         // beams kept at each step; 1 is greedy decoding
  std::size_t max_tokens = 64;   // the token limit of every beam
  float length_penalty = 1.0f;   // beams are ranked by log-prob / tokens^length_penalty; 0: raw log-prob
  bool stop_at_eos = true;       // a beam that samples end-of-sequence is finished (its log-prob counts)
  kv_type kv = kv_type::f32;     // the element type of every beam's cache
};

struct beam {
  std::vector<std::int32_t> ids;  // the continuation, with a final end-of-sequence token if it ended so
  std::string text;               // without that token
  double log_prob = 0.0;          // the sum of log p(id | everything before it) over ids
  double score = 0.0;             // log_prob / ids.size()^length_penalty: the ranking
  bool finished = false;          // ended at end-of-sequence (otherwise at the token limit)
};

namespace detail {

// log softmax of one position's logits, in double so that distinct logits keep their order.
inline void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double z = 0.0;
  for (const float l : logits) z += std::exp(static_cast<double>(l) - top);
  const double lse = top + std::log(z);
  out.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

}  // namespace detail

// Beam search over one prompt: at every step each live beam is extended by its most
// likely tokens and the `width` best extensions over all beams survive (ties: the
// earlier beam, then the lower id, so width 1 is exactly greedy). Each beam owns a
// cache; a beam with one surviving child hands its cache on, and each further child
// gets a clone that copies only the written positions. Returns the finished and the
// live beams, best score first.
template <LlamaConfig C>
std::vector<beam> generate_beam(model<C>& m, const tokenizer& tok, std::span<const std::int32_t> prompt,
                                const beam_options& o = {}) {
  if (o.width == 0) throw error("beam search: width 0 keeps no beam; give 1 (greedy) or more");
  if (!std::isfinite(o.length_penalty) || o.length_penalty < 0.0f)
    throw error("beam search: length_penalty must be a finite number >= 0 (1 divides by the length, 0 ranks raw log-probs)");
  if (prompt.empty()) throw error("beam search: the prompt is empty; give at least one token");
  if (prompt.size() + o.max_tokens > C::context)
    throw capacity_error("beam search: the prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                         std::to_string(o.max_tokens) + " tokens exceed the context of " + std::to_string(C::context) +
                         "; lower max_tokens or shorten the prompt");
  struct live {
    kv_cache<C> cache;
    std::vector<float> logits;  // [V] of the last position
    beam b;
  };
  const auto score = [&](const beam& b) {
    if (b.ids.empty()) return 0.0;
    return o.length_penalty == 0.0f ? b.log_prob
                                    : b.log_prob / std::pow(static_cast<double>(b.ids.size()), static_cast<double>(o.length_penalty));
  };
  std::vector<beam> done;
  std::vector<live> beams;
  {
    kv_cache<C> cache(std::max<std::size_t>(prompt.size() + o.max_tokens, 1), o.kv);
    const auto l = m.prefill(prompt, cache);
    beams.push_back({std::move(cache), std::vector<float>(l.begin(), l.end()), {}});
  }
  struct candidate {
    double log_prob;
    std::size_t parent;
    std::int32_t id;
  };
  const auto better = [](const candidate& a, const candidate& b) {
    if (a.log_prob != b.log_prob) return a.log_prob > b.log_prob;
    if (a.parent != b.parent) return a.parent < b.parent;
    return a.id < b.id;
  };
  std::vector<double> lp;
  std::vector<candidate> cands, top;
  for (std::size_t step = 0; step < o.max_tokens && !beams.empty() && done.size() < o.width; ++step) {
    cands.clear();
    for (std::size_t p = 0; p < beams.size(); ++p) {
      detail::require_finite_logits(beams[p].logits, beams[p].cache.length() - 1);
      detail::log_softmax(beams[p].logits, lp);
      // This beam's `width` best tokens: no other token of it can be among the best `width` overall.
      top.clear();
      for (std::size_t i = 0; i < lp.size(); ++i) top.push_back({beams[p].b.log_prob + lp[i], p, static_cast<std::int32_t>(i)});
      const std::size_t k = std::min(o.width, top.size());
      std::partial_sort(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k), top.end(), better);
      cands.insert(cands.end(), top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k));
    }
    std::sort(cands.begin(), cands.end(), better);
    cands.resize(std::min(cands.size(), o.width - done.size()));
    std::vector<std::size_t> children(beams.size(), 0);
    for (const auto& c : cands) ++children[c.parent];
    std::vector<live> next;
    for (const auto& c : cands) {
      live& parent = beams[c.parent];
      beam b = parent.b;
      b.ids.push_back(c.id);
      b.log_prob = c.log_prob;
      if (o.stop_at_eos && tok.is_end_of_generation(c.id)) {
        b.finished = true;
        b.score = score(b);
        --children[c.parent];
        done.push_back(std::move(b));
        continue;
      }
      if (step + 1 == o.max_tokens) {  // the last token is never run through the model
        b.score = score(b);
        --children[c.parent];
        done.push_back(std::move(b));
        continue;
      }
      // The last child of a parent takes its cache; the others get clones.
      kv_cache<C> cache = --children[c.parent] == 0 ? std::move(parent.cache) : parent.cache.clone();
      const auto l = m.forward(c.id, cache);
      next.push_back({std::move(cache), std::vector<float>(l.begin(), l.end()), std::move(b)});
    }
    beams = std::move(next);
  }
  for (auto& lv : beams) {
    lv.b.score = score(lv.b);
    done.push_back(std::move(lv.b));
  }
  for (auto& b : done) {
    std::vector<std::int32_t> visible = b.ids;
    if (b.finished) visible.pop_back();
    b.text = tok.decode(visible);
  }
  std::stable_sort(done.begin(), done.end(), [](const beam& a, const beam& b) { return a.score > b.score; });
  return done;
}

}  // namespace tlm
