// Law: training state has the shape of the weights it trains. Gradients and AdamW's
// moments are the trainable struct itself, so their parameter counts are the
// weights'; every member of the trainable struct has the shape of the mapped one.
#include <tlm/linalg.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/step.hpp>

using namespace tlm;

// The number of parameters of a weight type, walked on types alone (owned storage
// allocates, so it cannot be built in a constant expression), and 0 unless every
// member of A has the shape of the same member of B.
template <class A, class B>
constexpr std::size_t params_if_same_shapes() {
  using UA = std::remove_cvref_t<A>;
  using UB = std::remove_cvref_t<B>;
  if constexpr (std::same_as<UA, absent>) {
    return 0;
  } else if constexpr (Tensor<UA>) {
    return same_shape<UA, UB> ? UA::rows * UA::cols : 0;
  } else if constexpr (detail::is_std_array_v<UA>) {
    return detail::array_extent_v<UA> * params_if_same_shapes<typename UA::value_type, typename UB::value_type>();
  } else {
    constexpr auto accessors_a = boost::hana::accessors<UA>();
    constexpr auto accessors_b = boost::hana::accessors<UB>();
    return boost::hana::unpack(boost::hana::make_range(boost::hana::size_c<0>, boost::hana::length(accessors_a)),
                               [&](auto... i) {
                                 return (params_if_same_shapes<
                                             decltype(boost::hana::second(accessors_a[i])(std::declval<UA&>())),
                                             decltype(boost::hana::second(accessors_b[i])(std::declval<UB&>()))>() +
                                         ...);
                               });
  }
}

template <class C>
constexpr bool state_matches_weights() {
  using W = trainable<C, float>;
  using M = std::remove_cvref_t<decltype(std::declval<adamw<W>&>().m())>;
  using V = std::remove_cvref_t<decltype(std::declval<adamw<W>&>().v())>;
  return std::same_as<M, W> && std::same_as<V, W> &&
         params_if_same_shapes<W, model_weights<C, mapped>>() == parameter_count_v<C> &&
         params_if_same_shapes<trainable<C, double>, model_weights<C, mapped>>() == parameter_count_v<C>;
}
static_assert(state_matches_weights<tiny_gqa>() && state_matches_weights<tiny_untied>() &&
              state_matches_weights<tiny_train>() && state_matches_weights<smollm2_135m>() &&
              state_matches_weights<smollm2_360m>() && state_matches_weights<smollm2_1_7b>());
static_assert(params_if_same_shapes<trainable<smollm2_135m>, model_weights<smollm2_135m>>() == 134'515'008);
// The check can fail: another config's weights do not match member by member.
static_assert(params_if_same_shapes<trainable<smollm2_135m>, model_weights<smollm2_360m>>() != 134'515'008);

// A gradient is its parameters' type; moments likewise. Mapped weights do not train.
static_assert(gradient_of<trainable<smollm2_135m>, trainable<smollm2_135m>>);
static_assert(!gradient_of<trainable<smollm2_360m>, trainable<smollm2_135m>>);
static_assert(!gradient_of<trainable<smollm2_135m, double>, trainable<smollm2_135m, float>>);
static_assert(moments_of<trainable<tiny_gqa>, trainable<tiny_gqa>>);
static_assert(!moments_of<trainable<tiny_untied>, trainable<tiny_gqa>>);
static_assert(trainable_weights<trainable<smollm2_135m>> && trainable_weights<layer_weights<smollm2_135m, owned<>>>);
static_assert(!trainable_weights<model_weights<smollm2_135m>> && !trainable_weights<layer_weights<smollm2_135m>>);

// Typed batches: matmul(mat<R, C>, rows<C>) -> rows<R>, for mapped and owned weights.
template <class W, class X, class Y>
concept can_matmul = requires(const W& w, const X& x, Y& y) { matmul(w, x, y); };
static_assert(can_matmul<mat<192, 576>, rows<576>, rows<192>>);
static_assert(can_matmul<mat<192, 576, owned<double>>, rows<576, double>, rows<192, double>>);
static_assert(!can_matmul<mat<192, 576>, rows<192>, rows<192>>);
static_assert(!can_matmul<mat<192, 576, owned<double>>, rows<576, float>, rows<192, float>>);
