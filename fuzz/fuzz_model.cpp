// libFuzzer target for everything a GGUF file reaches after the reader: the
// tokenizer section (tokenizer::from_gguf), binding to config types (bind<C>) and
// loading a model, then running it. Any byte string must either be refused with a
// tlm::error or give a model that runs:
//   - bind<C> throws exactly bind_error (the reader already accepted the file);
//   - a file that binds also loads, and prefill/forward over a few tokens stay in
//     bounds and give logits for every vocabulary entry (random weights may make
//     them non-finite, which is not a contract of the model);
//   - a tokenizer that loads round-trips the ids of its own encode of a short text.
// The seeds (fuzz/seeds/fuzz_model) are tiny_gqa and tiny_untied files written by
// examples/synth_model, so mutations start from files that bind.
#include <tlm/format/gguf.hpp>
#include <tlm/load.hpp>
#include <tlm/model.hpp>
#include <tlm/text/tokenizer.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

template <tlm::LlamaConfig C>
void try_model(const tlm::gguf::file& f) {
  try {
    (void)tlm::bind<C>(f);
  } catch (const tlm::bind_error&) {
    return;  // the common case: a mutated file that does not fit C
  }
  // It binds, so loading must succeed: the model binds the same file again.
  tlm::model<C> m(tlm::gguf::file::from_memory(f.bytes(), f.name()), {.threads = 1});
  tlm::kv_cache<C> cache(4);
  const std::vector<std::int32_t> prompt = {0, static_cast<std::int32_t>(C::vocab - 1)};
  std::vector<float> all;
  const auto logits = m.prefill(prompt, cache, &all);
  require(logits.size() == C::vocab && all.size() == prompt.size() * C::vocab);
  const auto next = m.forward(1, cache);
  require(next.size() == C::vocab && cache.length() == 3);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  std::optional<tlm::gguf::file> f;
  try {
    f.emplace(tlm::gguf::file::from_memory(bytes, "fuzz.gguf"));
  } catch (const tlm::format_error&) {
    return 0;
  }
  try {
    const auto tok = tlm::tokenizer::from_gguf(*f);
    const auto ids = tok.encode("ab a\n", {});
    for (const auto id : ids) require(id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size());
    (void)tok.decode(ids);
  } catch (const tlm::error&) {
  }
  try_model<tlm::tiny_gqa>(*f);
  try_model<tlm::tiny_untied>(*f);
  // A large config's binding must refuse a small file without touching its data.
  try {
    (void)tlm::bind<tlm::smollm2_135m>(*f);
    __builtin_trap();  // no input this small can hold 135M parameters
  } catch (const tlm::bind_error&) {
  }
  return 0;
}
