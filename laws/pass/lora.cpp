// Law: an adapter trains over a base that stays mapped. The adapter step (forward,
// backward, AdamW) compiles over the file-backed weights of a loaded model, while an
// optimizer step over those weights still does not (laws/fail/train_on_mapped_weights);
// the adapter's gradients and moments are the adapter's own type, and its parameter
// count is what the walk sees: only the targeted matrices' factors.
#include <tlm/train/adamw.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/step.hpp>

#include <span>

using namespace tlm;

using C = smollm2_135m;
using base = model_weights<C, mapped>;
using adapter = lora<C, 16>;
using ids = std::span<const std::int32_t>;

// The adapter step over the mapped base.
static_assert(requires(training<C>& run, const base& w, const adapter& a, adapter& g, ids t) {
  { run.forward(w, a, t, t) } -> std::same_as<double>;
  run.backward(w, a, g);
});
static_assert(requires(adamw<adapter>& opt, adapter& a, const adapter& g) { opt.step(a, g); });
static_assert(trainable_weights<adapter> && gradient_of<adapter, adapter> && moments_of<adapter, adapter>);

// The base itself still does not train: it is not trainable, full training does not
// take it, and an adapter's gradient is not a base's.
static_assert(!trainable_weights<base>);
template <class W>
concept full_training_takes = requires(training<C>& run, const W& w, ids t) { run.forward(w, t, t); };
static_assert(!full_training_takes<base> && full_training_takes<trainable<C>>);
static_assert(!gradient_of<trainable<C>, adapter>);
// A frozen base multiplies activations of its own element type: a mapped base takes
// float, so a double adapter run over it does not compile.
static_assert(frozen_base_for<base, C, float> && !frozen_base_for<base, C, double>);
static_assert(frozen_base_for<trainable<C, double>, C, double>);

// Counted on types alone (owned storage allocates, so no instance in a constant
// expression): rows x cols of every tensor the walk would visit.
template <class U>
constexpr std::size_t count_params() {
  if constexpr (std::same_as<U, absent>) {
    return 0;
  } else if constexpr (Tensor<U>) {
    return U::rows * U::cols;
  } else if constexpr (detail::is_std_array_v<U>) {
    return detail::array_extent_v<U> * count_params<typename U::value_type>();
  } else {
    constexpr auto acc = boost::hana::accessors<U>();
    return boost::hana::unpack(boost::hana::make_range(boost::hana::size_c<0>, boost::hana::length(acc)), [&](auto... i) {
      return (count_params<std::remove_cvref_t<decltype(boost::hana::second(acc[i])(std::declval<U&>()))>>() + ...);
    });
  }
}
// PEFT's count for r = 8 on q, k, v, o of SmolLM2-135M: 30 layers x (2 x 8 x (576 +
// 576) for q and o + 2 x 8 x (576 + 192) for k and v) = 921,600.
static_assert(count_params<lora<C, 8>>() == 921'600);
// Every one of the seven: + 30 x 8 x 3 x (576 + 1536) for gate, up and down.
static_assert(count_params<lora<C, 8, all_layer_matrices>>() == 921'600 + 30 * 8 * 3 * (576 + 1536));
