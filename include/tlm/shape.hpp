#pragma once
// Typed shapes. Extents are compile-time; the element encoding of stored weights
// is a run-time tag, because one GGUF file mixes encodings.
//
//   vec<N, S>     N values                      (a row of length N)
//   mat<R, C, S>  R rows (outputs) of C columns (inputs)
//   rows<N, T>    a batch: a run-time count of rows of N values each, [n, N]
//
// S is the storage: `mapped` views encoded bytes owned by someone else (a file
// mapping); `owned<T>` holds zero-initialised values of T = float or double
// (activations, trainable weights, gradients, optimizer moments; double for
// gradient checks). vec defaults to owned<float>, mat to mapped, because that is
// how each is used most.
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

#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>

namespace tlm {

struct mapped {};
template <class T = float>
struct owned {
  using value_type = T;
};

// The element types an owned tensor may hold: float for training and inference,
// double for gradient checks against finite differences.
template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double>;

template <class S>
inline constexpr bool is_owned_v = false;
template <class T>
inline constexpr bool is_owned_v<owned<T>> = Element<T>;

template <class S>
concept Storage = std::same_as<S, mapped> || is_owned_v<S>;

// The value type of an owned storage; float for mapped (what its kernels produce).
template <class S>
struct storage_value {
  using type = float;
};
template <class T>
struct storage_value<owned<T>> {
  using type = T;
};
template <class S>
using storage_value_t = typename storage_value<S>::type;

namespace detail {

// 64-byte aligned, zero-initialised storage of T with value semantics.
template <class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(std::size_t n) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    p_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!p_) throw std::bad_alloc();
    std::memset(static_cast<void*>(p_.get()), 0, bytes);
  }
  buffer(const buffer& o) : buffer(o.n_) {
    if (n_) std::memcpy(static_cast<void*>(p_.get()), o.p_.get(), n_ * sizeof(T));
  }
  buffer& operator=(const buffer& o) {
    if (this != &o) *this = buffer(o);
    return *this;
  }
  buffer(buffer&&) noexcept = default;
  buffer& operator=(buffer&&) noexcept = default;

  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct free_deleter {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], free_deleter> p_;
  std::size_t n_ = 0;
};

using f32_buffer = buffer<float>;

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

template <std::size_t Rows, std::size_t Cols, class T>
class tensor_store<Rows, Cols, owned<T>> {
 public:
  tensor_store() : values_(Rows * Cols) {}

  constexpr bool bound() const { return true; }
  // Float tensors are F32 bytes to the kernels; double ones have no file encoding.
  constexpr encoding enc() const
    requires std::same_as<T, float>
  {
    return encoding::f32;
  }
  std::span<const std::byte> bytes() const
    requires std::same_as<T, float>
  {
    return {reinterpret_cast<const std::byte*>(values_.data()), Rows * Cols * sizeof(float)};
  }
  T* data() { return values_.data(); }
  const T* data() const { return values_.data(); }
  std::span<T, Rows * Cols> values() { return std::span<T, Rows * Cols>(values_.data(), Rows * Cols); }
  std::span<const T, Rows * Cols> values() const { return std::span<const T, Rows * Cols>(values_.data(), Rows * Cols); }

 private:
  buffer<T> values_;
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

template <std::size_t N, Storage S = owned<>>
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

  using value_type = storage_value_t<S>;

  value_type& operator[](std::size_t i)
    requires is_owned_v<S>
  {
    return this->data()[i];
  }
  value_type operator[](std::size_t i) const
    requires is_owned_v<S>
  {
    return this->data()[i];
  }
  operator std::span<value_type, N>()
    requires is_owned_v<S>
  {
    return this->values();
  }
  operator std::span<const value_type, N>() const
    requires is_owned_v<S>
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

  using value_type = storage_value_t<S>;

  value_type& operator()(std::size_t r, std::size_t c)
    requires is_owned_v<S>
  {
    return this->data()[r * C + c];
  }
  value_type operator()(std::size_t r, std::size_t c) const
    requires is_owned_v<S>
  {
    return this->data()[r * C + c];
  }
  // Row r of an owned matrix: [C]
  std::span<value_type, C> row(std::size_t r)
    requires is_owned_v<S>
  {
    return std::span<value_type, C>(this->data() + r * C, C);
  }
  std::span<const value_type, C> row(std::size_t r) const
    requires is_owned_v<S>
  {
    return std::span<const value_type, C>(this->data() + r * C, C);
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

// A batch of activations: a run-time count of rows, each N values of T. [n, N]
//
// The width is in the type, so matmul(mat<R, C>, rows<C>) -> rows<R> is checked by
// the compiler like matvec is; the count is a run-time value. Storage is reserved
// once and reused: resize() within the reserved capacity never allocates, so a
// workspace sized for the longest batch serves every shorter one.
template <std::size_t N, Element T = float>
class rows {
 public:
  static constexpr std::size_t width = N;
  using value_type = T;

  rows() = default;
  explicit rows(std::size_t n) : buf_(n * N), capacity_(n), count_(n) {}

  std::size_t count() const { return count_; }
  std::size_t capacity() const { return capacity_; }
  bool empty() const { return count_ == 0; }

  // Grows the storage to hold at least n rows (the only call that allocates).
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    detail::buffer<T> bigger(n * N);
    if (count_) std::memcpy(static_cast<void*>(bigger.data()), buf_.data(), count_ * N * sizeof(T));
    buf_ = std::move(bigger);
    capacity_ = n;
  }
  // Sets the count to n rows, reserving first if needed; new rows hold stale values.
  void resize(std::size_t n) {
    reserve(n);
    count_ = n;
  }
  // Sets every value of the counted rows to zero (gradients accumulate with +=).
  void zero() {
    if (count_) std::memset(static_cast<void*>(buf_.data()), 0, count_ * N * sizeof(T));
  }

  T* data() { return buf_.data(); }
  const T* data() const { return buf_.data(); }
  // Row i: [N]
  std::span<T, N> row(std::size_t i) { return std::span<T, N>(buf_.data() + i * N, N); }
  std::span<const T, N> row(std::size_t i) const { return std::span<const T, N>(buf_.data() + i * N, N); }
  // Every counted value: [n * N]
  std::span<T> values() { return {buf_.data(), count_ * N}; }
  std::span<const T> values() const { return {buf_.data(), count_ * N}; }

 private:
  detail::buffer<T> buf_;
  std::size_t capacity_ = 0;
  std::size_t count_ = 0;
};

template <class T>
inline constexpr bool is_rows_v = false;
template <std::size_t N, class T>
inline constexpr bool is_rows_v<rows<N, T>> = true;

}  // namespace tlm
