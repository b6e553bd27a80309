#pragma once
// Typed shapes. Extents are compile-time; the element encoding of stored weights
// is a run-time tag, because one GGUF file mixes encodings.
//
//   vec<N, S>     N values                      (a row of length N)
//   mat<R, C, S>  R rows (outputs) of C columns (inputs)
//
// S is the storage: `mapped` views encoded bytes owned by someone else (a file
// mapping); `owned` holds zero-initialised f32 values (activations, training
// master weights, gradients, optimizer moments). vec defaults to owned, mat to
// mapped, because that is how each is used most.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>

#include "encoding.hpp"
#include "error.hpp"

namespace tlm {

struct mapped {};
struct owned {};

template <class S>
concept Storage = std::same_as<S, mapped> || std::same_as<S, owned>;

namespace detail {

// 64-byte aligned, zero-initialised float storage with value semantics.
class f32_buffer {
 public:
  f32_buffer() = default;
  explicit f32_buffer(std::size_t n) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    p_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!p_) throw std::bad_alloc();
    std::memset(p_.get(), 0, bytes);
  }
  f32_buffer(const f32_buffer& o) : f32_buffer(o.n_) {
    if (n_) std::memcpy(p_.get(), o.p_.get(), n_ * sizeof(float));
  }
  f32_buffer& operator=(const f32_buffer& o) {
    if (this != &o) *this = f32_buffer(o);
    return *this;
  }
  f32_buffer(f32_buffer&&) noexcept = default;
  f32_buffer& operator=(f32_buffer&&) noexcept = default;

  float* data() { return p_.get(); }
  const float* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct free_deleter {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], free_deleter> p_;
  std::size_t n_ = 0;
};

// The storage half of a tensor, shared by vec and mat. Elements = Rows * Cols.
template <std::size_t Rows, std::size_t Cols, class S>
class tensor_store;

template <std::size_t Rows, std::size_t Cols>
class tensor_store<Rows, Cols, mapped> {
 public:
  constexpr tensor_store() = default;

  // Points this tensor at encoded bytes, checking that they are exactly the
  // size its shape needs in that encoding. `what` names the tensor in errors.
  void bind(encoding enc, std::span<const std::byte> bytes, std::string_view what = "tensor") {
    const std::size_t per_row = row_bytes(enc, Cols);
    if (per_row == 0) {
      throw shape_error(std::string(what) + ": a row of " + std::to_string(Cols) + " values is not a whole number of " +
                        std::string(name(enc)) + " blocks (" + std::to_string(traits(enc).block_values) +
                        " values each); this encoding cannot hold this shape");
    }
    if (bytes.size() != per_row * Rows) {
      throw shape_error(std::string(what) + ": expected " + std::to_string(per_row * Rows) + " bytes for " +
                        std::to_string(Rows) + " x " + std::to_string(Cols) + " " + std::string(name(enc)) +
                        " values, got " + std::to_string(bytes.size()));
    }
    if (enc == encoding::f32 && reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(float) != 0) {
      throw shape_error(std::string(what) + ": F32 data is not 4-byte aligned in memory; the file's alignment is broken");
    }
    enc_ = enc;
    data_ = bytes.data();
    size_ = bytes.size();
  }

  constexpr bool bound() const { return data_ != nullptr; }
  constexpr encoding enc() const { return enc_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  encoding enc_ = encoding::f32;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

template <std::size_t Rows, std::size_t Cols>
class tensor_store<Rows, Cols, owned> {
 public:
  tensor_store() : values_(Rows * Cols) {}

  constexpr bool bound() const { return true; }
  constexpr encoding enc() const { return encoding::f32; }
  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(values_.data()), Rows * Cols * sizeof(float)};
  }
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  std::span<float, Rows * Cols> values() { return std::span<float, Rows * Cols>(values_.data(), Rows * Cols); }
  std::span<const float, Rows * Cols> values() const {
    return std::span<const float, Rows * Cols>(values_.data(), Rows * Cols);
  }

 private:
  f32_buffer values_;
};

}  // namespace detail

template <std::size_t N, Storage S>
class vec;
template <std::size_t R, std::size_t C, Storage S>
class mat;

// Two tensors may be assigned, copied in lockstep or paired as parameter and
// gradient only when their extents agree. Named, so that diagnostics name it.
template <class A, class B>
concept shapes_agree = A::rank == B::rank && A::rows == B::rows && A::cols == B::cols;

template <std::size_t N, Storage S = owned>
class vec : public detail::tensor_store<1, N, S> {
 public:
  static constexpr std::size_t rank = 1;
  static constexpr std::size_t rows = 1;
  static constexpr std::size_t cols = N;
  static constexpr std::size_t size = N;
  using storage = S;

  constexpr vec() = default;
  vec(const vec&) = default;
  vec(vec&&) noexcept = default;
  vec& operator=(const vec&) = default;
  vec& operator=(vec&&) noexcept = default;

  // A vector of another length is another type. This candidate exists only so
  // that the compiler's "no match" names the rule that was broken.
  template <std::size_t M, Storage S2>
    requires shapes_agree<vec, vec<M, S2>> && (!std::same_as<vec, vec<M, S2>>)
  vec& operator=(const vec<M, S2>&) = delete;  // mapped <-> owned: copy values explicitly

  float& operator[](std::size_t i)
    requires std::same_as<S, owned>
  {
    return this->data()[i];
  }
  float operator[](std::size_t i) const
    requires std::same_as<S, owned>
  {
    return this->data()[i];
  }
  operator std::span<float, N>()
    requires std::same_as<S, owned>
  {
    return this->values();
  }
  operator std::span<const float, N>() const
    requires std::same_as<S, owned>
  {
    return this->values();
  }
  // The f32 values of a mapped vector (norm gains): binding accepts only F32 for vectors.
  std::span<const float, N> f32() const
    requires std::same_as<S, mapped>
  {
    return std::span<const float, N>(reinterpret_cast<const float*>(this->bytes().data()), N);
  }
};

template <std::size_t R, std::size_t C, Storage S = mapped>
class mat : public detail::tensor_store<R, C, S> {
 public:
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = R;
  static constexpr std::size_t cols = C;
  using storage = S;

  constexpr mat() = default;
  mat(const mat&) = default;
  mat(mat&&) noexcept = default;
  mat& operator=(const mat&) = default;
  mat& operator=(mat&&) noexcept = default;

  // Swapped or mis-shaped weights are other types. This candidate exists only so
  // that the compiler's "no match" names the rule that was broken.
  template <std::size_t R2, std::size_t C2, Storage S2>
    requires shapes_agree<mat, mat<R2, C2, S2>> && (!std::same_as<mat, mat<R2, C2, S2>>)
  mat& operator=(const mat<R2, C2, S2>&) = delete;  // mapped <-> owned: copy values explicitly

  float& operator()(std::size_t r, std::size_t c)
    requires std::same_as<S, owned>
  {
    return this->data()[r * C + c];
  }
  float operator()(std::size_t r, std::size_t c) const
    requires std::same_as<S, owned>
  {
    return this->data()[r * C + c];
  }
  // Row r of an owned matrix: [C]
  std::span<float, C> row(std::size_t r)
    requires std::same_as<S, owned>
  {
    return std::span<float, C>(this->data() + r * C, C);
  }
  std::span<const float, C> row(std::size_t r) const
    requires std::same_as<S, owned>
  {
    return std::span<const float, C>(this->data() + r * C, C);
  }
};

template <class T>
inline constexpr bool is_vec_v = false;
template <std::size_t N, class S>
inline constexpr bool is_vec_v<vec<N, S>> = true;
template <class T>
inline constexpr bool is_mat_v = false;
template <std::size_t R, std::size_t C, class S>
inline constexpr bool is_mat_v<mat<R, C, S>> = true;

// A leaf of a weight struct: something with a compile-time shape and storage.
template <class T>
concept Tensor = is_vec_v<std::remove_cvref_t<T>> || is_mat_v<std::remove_cvref_t<T>>;

// Same rank and extents; storage may differ (a file view and its f32 master copy).
template <class A, class B>
concept same_shape = Tensor<A> && Tensor<B> && shapes_agree<std::remove_cvref_t<A>, std::remove_cvref_t<B>>;

}  // namespace tlm
