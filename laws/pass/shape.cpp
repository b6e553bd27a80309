// Law: matvec(mat<R, C>, vec<C>) has type vec<R>; a product whose inner sizes
// differ, or an assignment between tensors of different shapes, is not offered.
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

#include <span>

using namespace tlm;

template <class M, class V>
concept can_matvec = requires(const M& m, const V& v) { matvec(m, v); };

template <class A, class B>
inline constexpr bool assignable = std::is_assignable_v<A&, const B&>;

static_assert(std::is_same_v<decltype(matvec(std::declval<const mat<3, 5>&>(), std::declval<const vec<5>&>())), vec<3>>);
static_assert(std::is_same_v<decltype(matvec(std::declval<const mat<5, 3, owned<>>&>(), std::declval<const vec<3>&>())), vec<5>>);

using l = layer_weights<smollm2_135m>;
static_assert(std::is_same_v<decltype(matvec(std::declval<const decltype(l::attn_k)&>(), std::declval<const vec<576>&>())),
                             vec<192>>);
static_assert(std::is_same_v<decltype(matvec(std::declval<const decltype(l::ffn_down)&>(), std::declval<const vec<1536>&>())),
                             vec<576>>);
static_assert(can_matvec<mat<3, 5>, vec<5>>);
static_assert(!can_matvec<mat<3, 5>, vec<3>>);
static_assert(!can_matvec<decltype(l::ffn_down), vec<576>>);

// Shapes are part of the type.
static_assert(assignable<mat<576, 576>, mat<576, 576>>);
static_assert(!assignable<mat<576, 576>, mat<192, 576>>);
static_assert(!assignable<mat<576, 576>, mat<576, 576, owned<>>>);
static_assert(!assignable<vec<4>, vec<5>>);
static_assert(!assignable<layer_weights<smollm2_135m>, layer_weights<smollm2_360m>>);
static_assert(assignable<layer_weights<smollm2_135m>, layer_weights<smollm2_135m>>);

// The non-allocating form takes spans of exactly the right extents.
static_assert(!std::is_convertible_v<std::span<const float, 192>, std::span<const float, 576>>);
