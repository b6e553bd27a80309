#pragma once
// Each kernel level's function table: which kernel serves each encoding for matvec,
// matmul and the fast (integer) mode, and the vector and attention kernels. The
// tables are built once, at first use (some choices follow the CPU: cpu().amd, VNNI);
// a level's row in kernels/levels.hpp names its table.
#include <tlm/cpu.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/kernels/amx.hpp>
#include <tlm/kernels/attention_avx512.hpp>
#include <tlm/kernels/avx2.hpp>
#include <tlm/kernels/avx2_kquant.hpp>
#include <tlm/kernels/avx512.hpp>
#include <tlm/kernels/scalar.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

namespace tlm {
// The kernel families, in increasing order of what they need from the CPU; each has a
// row in kernels/levels.hpp.
enum class kernel_level { scalar = 0, avx2 = 1, avx512 = 2, amx = 3 };
}  // namespace tlm

namespace tlm::kernels {

namespace detail {

// Encodings that have a matrix kernel, as table slots.
inline constexpr encoding table_encodings[] = {encoding::f32,  encoding::f16,  encoding::bf16, encoding::q8_0,
                                               encoding::q4_0, encoding::q4_1, encoding::q5_0, encoding::q5_1,
                                               encoding::q4_k, encoding::q5_k, encoding::q6_k};
inline constexpr std::size_t table_size = std::size(table_encodings);

constexpr int slot(encoding enc) {
  for (std::size_t i = 0; i < table_size; ++i) {
    if (table_encodings[i] == enc) return static_cast<int>(i);
  }
  return -1;
}

// The slot of an encoding known at compile time; the tables are built from these, so a
// missing slot is a compile error, not an index of -1.
template <encoding E>
inline constexpr std::size_t slot_of = [] {
  static_assert(slot(E) >= 0, "encoding without a table slot");
  return static_cast<std::size_t>(slot(E));
}();

struct kernel_table {
  kernel_level level;
  matvec_rows_fn matvec[table_size];
  prepare_x_fn prepare[table_size];  // null: matvec takes x as it is
  matmul_rows_fn matmul[table_size];
  // A batch of fewer than `matmul_min_batch[slot]` rows goes to matmul_narrow instead
  // (null: matmul takes every batch).
  matmul_rows_fn matmul_narrow[table_size];
  std::size_t matmul_min_batch[table_size];
  // precision::fast; null where the encoding has no integer path (it runs exact).
  // A fast matmul of at most `integer_max_batch[slot]` activation rows runs matmul_q8; a
  // larger one the float32 GEMM (matmul, the exact product), the faster kernel there
  // (see set_integer_max_batch). Decode (one row) keeps matvec_q8.
  std::size_t integer_max_batch[table_size];
  quantize_fn quantize;
  matvec_q8_fn matvec_q8[table_size];
  matmul_q8_fn matmul_q8[table_size];
  float (*dot)(const float*, const float*, std::size_t);
  void (*axpy)(float, const float*, float*, std::size_t);
  float (*dot_i8)(const float*, const std::int8_t*, std::size_t);
  void (*axpy_i8)(float, const std::int8_t*, float*, std::size_t);
  attention_kernels attention;  // kernels/attention_scalar.hpp
};

// Encodings with an integer (precision::fast) path: every quantized weight encoding.
inline constexpr encoding fast_encodings[] = {encoding::q8_0, encoding::q4_0, encoding::q4_1, encoding::q5_0,
                                              encoding::q5_1, encoding::q4_k, encoding::q5_k, encoding::q6_k};

inline const kernel_table& scalar_table() {
  static const kernel_table t = [] {
    kernel_table k{};
    k.level = kernel_level::scalar;
    // Portable C++ sums int8 products no faster than float ones, and the float32 GEMM
    // reuses each decoded weight row: a fast matmul is the exact one at every batch.
    // Q4_1 1536x576, 1 thread, µs float32 / integer: 4 rows 642 / 1,572, 8: 945 / 3,160
    // (bench/results/kernels-decode-batch-xeon.md). The integer kernels stay the
    // definition the SIMD ones are tested against (matmul_fast_reference).
    for (auto& n : k.integer_max_batch) n = 1;
    for (std::size_t i = 0; i < table_size; ++i) {
      k.matvec[i] = &matvec_rows_scalar;
      k.matmul[i] = &matmul_rows_scalar;
    }
    k.quantize = &quantize_scalar;
    for (encoding e : fast_encodings) {
      k.matvec_q8[static_cast<std::size_t>(slot(e))] = &matvec_q8_scalar;
      k.matmul_q8[static_cast<std::size_t>(slot(e))] = &matmul_q8_scalar;
    }
    k.dot = &dot_scalar;
    k.axpy = &axpy_scalar;
    k.dot_i8 = &dot_i8_scalar;
    k.axpy_i8 = &axpy_i8_scalar;
    k.attention = attention_scalar;
    return k;
  }();
  return t;
}

#ifdef TLM_HAVE_AVX2_KERNELS
template <encoding E>
constexpr void set_avx2(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx2::matvec_rows<E>;
  k.matmul[slot_of<E>] = &avx2::matmul_rows<&avx2::decode_row<E>>;
}

// Decode-speed matvec with the block scales factored out (avx2.hpp); matmul decodes.
template <encoding E>
constexpr void set_avx2_q4(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx2::matvec_rows_q4<E, true>;
  k.prepare[slot_of<E>] = &avx2::prepare_q4_x<E>;
  k.matmul[slot_of<E>] = &avx2::matmul_rows<&avx2::decode_row<E>>;
}

// Q5_0 / Q5_1: the block scale factored out of the decode-speed matvec (avx2.hpp), the
// prefill GEMM over the bit-exact decoder.
template <encoding E>
constexpr void set_avx2_q5(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx2::matvec_rows_q5<E>;
  k.prepare[slot_of<E>] = &avx2::prepare_q5_x<E>;
  k.matmul[slot_of<E>] = &avx2::matmul_rows<&avx2::decode_row<E>>;
}

template <encoding E>
constexpr void set_avx2_fast(kernel_table& k) {
  k.matvec_q8[slot_of<E>] = &avx2::matvec_q8<E, true>;
  k.matmul_q8[slot_of<E>] = &avx2::matmul_q8<E>;
}

// K-quants (avx2_kquant.hpp): SIMD decoders for exact matvec and the prefill GEMM,
// integer sums for the fast mode.
template <encoding E>
constexpr void set_avx2_k(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx2::matvec_rows_k<E>;
  k.prepare[slot_of<E>] = &avx2::prepare_k_x<E>;
  k.matmul[slot_of<E>] = &avx2::matmul_rows<&avx2::decode_row_k<E>>;
  k.matvec_q8[slot_of<E>] = &avx2::matvec_q8_k<E>;
  k.matmul_q8[slot_of<E>] = &avx2::matmul_q8_k<E>;
}

// Where a fast matmul stops taking the integer kernels: at most `legacy` rows for the
// 32-value block encodings, `k_quants` for the 256-value ones.
//
// With AVX-512 VNNI there is no such point: avx512::matmul_q8 puts 16 weight rows in the
// lanes and pays the block scales once per 16 outputs: 2.1-4.2x faster than the float32
// GEMM from 2 to 512 rows (2 threads; bench/results/kernels-fast-lanes-xeon.md). Measured on a
// Xeon only: Zen 4 runs the same code, with slower gathers (the unpacking, one gather per
// 4 values of 16 rows, once per call) and 512-bit operations in two halves; not measured.
//
// At the AVX2 level (and AVX-512 without VNNI) the integer kernels hold 32-64 values of
// one row per register and win only on short batches (a server's decode step over a few
// sequences): one vpmaddubsw covers 32 products, but every block still needs its scales
// applied in float (convert, multiply, multiply-add), about as many instructions as the
// float32 GEMM spends on the same products, and the GEMM keeps each decoded weight vector
// in registers across the batch. A K-quant block of 256 values pays its float scales
// once per 8 sub-blocks, hence its later crossover. Measured on a 2-vCPU Xeon, 2 threads,
// integer / float32 time at the crossover and the next size
// (bench/results/kernels-fast-crossover-xeon.md): legacy 0.81-1.04 at 8 and 0.99-1.17 at
// 12, K-quants 0.73-0.99 at 16 and 1.04-1.11 at 24; above them the GEMM wins by up to 2.2x.
inline constexpr std::size_t no_crossover = std::numeric_limits<std::size_t>::max();

constexpr void set_integer_max_batch(kernel_table& k, std::size_t legacy, std::size_t k_quants) {
  for (encoding e : fast_encodings)
    k.integer_max_batch[static_cast<std::size_t>(slot(e))] = traits(e).block_values == 256 ? k_quants : legacy;
}

inline const kernel_table& avx2_table() {
  static const kernel_table t = [] {
    kernel_table k{};
    k.level = kernel_level::avx2;
    set_avx2<encoding::f32>(k);
    set_avx2<encoding::f16>(k);
    set_avx2<encoding::bf16>(k);
    set_avx2_q4<encoding::q4_0>(k);
    set_avx2_q4<encoding::q4_1>(k);
    set_avx2_q5<encoding::q5_0>(k);
    set_avx2_q5<encoding::q5_1>(k);
    k.matvec[slot_of<encoding::q8_0>] = &avx2::matvec_rows_q8<true>;
    k.matmul[slot_of<encoding::q8_0>] = &avx2::matmul_rows<&avx2::decode_row<encoding::q8_0>>;
    set_avx2_k<encoding::q4_k>(k);
    set_avx2_k<encoding::q5_k>(k);
    set_avx2_k<encoding::q6_k>(k);
    k.dot = &avx2::dot;
    k.axpy = &avx2::axpy;
    k.dot_i8 = &avx2::dot_i8;
    k.axpy_i8 = &avx2::axpy_i8;
    k.attention = attention_avx2::table;
    k.quantize = &avx2::quantize;
    set_avx2_fast<encoding::q8_0>(k);
    set_avx2_fast<encoding::q4_0>(k);
    set_avx2_fast<encoding::q4_1>(k);
    set_avx2_fast<encoding::q5_0>(k);
    set_avx2_fast<encoding::q5_1>(k);
    if (cpu().amd) {
      // The fast K-quant matvec and the Q4_0 / Q4_1 / Q8_0 matvecs, exact and fast, without
      // software prefetch: measured slower with it on Zen 4 (avx2_kquant.hpp, row_dots_k;
      // bench/results/kernels-kquant-steps-zen4.md). Intel keeps it: on the Xeon the
      // Q4_0 / Q4_1 / Q8_0 ones streamed from DRAM 1.4-1.9x faster with it
      // (bench/results/kernels-avx2-prefetch-xeon.md). The Q5 kernels prefetch on both.
      k.matvec_q8[slot_of<encoding::q4_k>] = &avx2::matvec_q8_k<encoding::q4_k, false>;
      k.matvec_q8[slot_of<encoding::q5_k>] = &avx2::matvec_q8_k<encoding::q5_k, false>;
      k.matvec_q8[slot_of<encoding::q6_k>] = &avx2::matvec_q8_k<encoding::q6_k, false>;
      k.matvec[slot_of<encoding::q4_0>] = &avx2::matvec_rows_q4<encoding::q4_0, false>;
      k.matvec[slot_of<encoding::q4_1>] = &avx2::matvec_rows_q4<encoding::q4_1, false>;
      k.matvec[slot_of<encoding::q8_0>] = &avx2::matvec_rows_q8<false>;
      k.matvec_q8[slot_of<encoding::q4_0>] = &avx2::matvec_q8<encoding::q4_0, false>;
      k.matvec_q8[slot_of<encoding::q4_1>] = &avx2::matvec_q8<encoding::q4_1, false>;
      k.matvec_q8[slot_of<encoding::q8_0>] = &avx2::matvec_q8<encoding::q8_0, false>;
    }
    set_integer_max_batch(k, 8, 16);
    return k;
  }();
  return t;
}
#endif

#ifdef TLM_HAVE_AVX512_KERNELS
template <encoding E>
constexpr void set_avx512(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx512::matvec_rows<E>;
  k.prepare[slot_of<E>] =
      E == encoding::q4_1 || E == encoding::q4_0 || E == encoding::q5_0 || E == encoding::q5_1 ? &avx512::prepare_q4_x<E>
                                                                                                : nullptr;
  k.matmul[slot_of<E>] = &avx512::matmul_rows<&avx2::decode_row<E>>;
}

// K-quants: the AVX-512 exact matvec (avx512.hpp), the prefill GEMM over the AVX2
// decoders (avx2_kquant.hpp; decoding is 1/64 of a prefill's work).
template <encoding E>
constexpr void set_avx512_k(kernel_table& k) {
  k.matvec[slot_of<E>] = &avx512::matvec_rows<E>;
  k.prepare[slot_of<E>] = &avx512::prepare_k_x<E>;
  k.matmul[slot_of<E>] = &avx512::matmul_rows<&avx2::decode_row_k<E>>;
}

// The K-quants' fast matvec takes groups of 256 (matvec_q8_k), the others blocks of 32.
template <encoding E>
constexpr void set_avx512_fast(kernel_table& k) {
  if constexpr (is_k_quant(E)) k.matvec_q8[slot_of<E>] = &avx512::matvec_q8_k<E>;
  else k.matvec_q8[slot_of<E>] = &avx512::matvec_q8<E>;
  k.matmul_q8[slot_of<E>] = &avx512::matmul_q8<E>;
}

// Starts from the AVX2 table (the level needs everything AVX2 does) and replaces the
// kernels that have AVX-512 versions. The fast mode uses VNNI where the CPU has it,
// and the AVX2 maddubs kernels otherwise (AVX-512 without VNNI: Skylake-SP).
inline const kernel_table& avx512_table() {
  static const kernel_table t = [] {
    kernel_table k = avx2_table();
    k.level = kernel_level::avx512;
    set_avx512<encoding::f32>(k);
    set_avx512<encoding::f16>(k);
    set_avx512<encoding::bf16>(k);
    set_avx512<encoding::q8_0>(k);
    set_avx512<encoding::q4_0>(k);
    set_avx512<encoding::q4_1>(k);
    set_avx512<encoding::q5_0>(k);
    set_avx512<encoding::q5_1>(k);
    set_avx512_k<encoding::q4_k>(k);
    set_avx512_k<encoding::q5_k>(k);
    set_avx512_k<encoding::q6_k>(k);
    if (cpu().amd) {
      // Exact decode of quantized rows is bound by the int-to-float widening, which
      // Zen 4 executes 256 bits at a time: its AVX2 kernels measured 10-35% faster
      // than the 512-bit ones (Q4_1 11.1 against 9.8 GB/s, Q4_0 9.3 against 6.9;
      // bench/results/kernels.md). The AVX-512 versions stay tested
      // (tests/test_kernels.cpp) and serve CPUs with full-width 512-bit units.
      // Q5_0, Q5_1 and the K-quants keep their AVX-512 matvec on AMD too: on an EPYC
      // of family 26 (Zen 5) they measured 1.50-1.66x the AVX2 ones exact and 1.33-1.73x
      // fast, hot and from DRAM (bench/results/kernels-kquant-avx512-epyc.md). On Zen 4
      // they win too, cold, 1 thread, GB/s AVX-512 / AVX2 (medians): Q5_0 1536x576
      // exact 7.5 / 6.3, fast 10.8 / 9.0 (bench/results/kernels-kquant-zen4.md);
      // 2048x2048 exact, the K-quants' codes widened in 128-bit lanes at both levels,
      // Q4_K 10.0 / 9.4, Q5_K 10.0 / 9.2, Q6_K 10.8 / 10.0
      // (bench/results/kernels-kquant-exact-zen4.md).
      for (std::size_t i : {slot_of<encoding::q8_0>, slot_of<encoding::q4_0>, slot_of<encoding::q4_1>}) {
        k.matvec[i] = avx2_table().matvec[i];
        k.prepare[i] = avx2_table().prepare[i];
      }
    }
    // The AVX-512 prefill kernel puts 16 batch rows in the lanes of one register, so a
    // prompt of 5 tokens leaves 11 of 16 lanes idle; the AVX2 kernel (a dot product
    // per batch row) wastes none. Splitting a batch between the two would decode each
    // weight row twice, so a short batch goes to AVX2 whole. Prefill on Zen 4, one
    // thread, tokens/s AVX2 / AVX-512: 5 tokens 166 / 93, 8: 207 / 147, 21: 269-320 /
    // 244, 32: 331 / 319-351, 64: 310-349 / 367-381 (bench/results/issue10-epyc-avx512.md).
    // Zen 4 runs a 512-bit FMA as two 256-bit halves, hence its later crossover.
    for (std::size_t i = 0; i < table_size; ++i) k.matmul_narrow[i] = avx2_table().matmul[i];
    for (std::size_t i = 0; i < table_size; ++i) k.matmul_min_batch[i] = cpu().amd ? 32 : 16;
    k.dot = &avx512::dot;
    k.axpy = &avx512::axpy;
    k.dot_i8 = &avx512::dot_i8;
    k.axpy_i8 = &avx512::axpy_i8;
    k.attention = attention_avx512::table;
    k.quantize = &avx512::quantize;
    if (cpu().avx512vnni && !cpu().amd) {
      // Exact Q5_0 / Q5_1 with x as three bytes per value (prepare_q5_digits): on the
      // Intel Xeon (family 6 model 167), Q5_0 1536x576, 1 thread, hot 55.6 against
      // 37.4-38.2 us (with 4 rows a step), and SmolLM2's Q4_K_M file, mostly Q5_0, decoded
      // exact in 7.00-7.12 against 8.43-8.47 ms/token (kernels-q5-digits-xeon.md). AMD
      // keeps the float kernels (here and for the K-quants below): not measured there yet.
      k.matvec[slot_of<encoding::q5_0>] = &avx512::matvec_rows_q5_digits<encoding::q5_0>;
      k.prepare[slot_of<encoding::q5_0>] = &avx512::prepare_q5_digits<encoding::q5_0>;
      k.matvec[slot_of<encoding::q5_1>] = &avx512::matvec_rows_q5_digits<encoding::q5_1>;
      k.prepare[slot_of<encoding::q5_1>] = &avx512::prepare_q5_digits<encoding::q5_1>;
      // The K-quants the same way (matvec_rows_k_digits): 2048x2048, 1 thread, hot, us,
      // float / digits: Q4_K 210-213 / 164, Q5_K 225-226 / 175, Q6_K 199-200 / 167-168;
      // a llama32_1b-shaped Q4_K_M file decoded exact in 66.7 against 76.1-76.3 ms/token
      // (kernels-kquant-digits-xeon.md).
      k.matvec[slot_of<encoding::q4_k>] = &avx512::matvec_rows_k_digits<encoding::q4_k>;
      k.prepare[slot_of<encoding::q4_k>] = &avx512::prepare_k_digits<encoding::q4_k>;
      k.matvec[slot_of<encoding::q5_k>] = &avx512::matvec_rows_k_digits<encoding::q5_k>;
      k.prepare[slot_of<encoding::q5_k>] = &avx512::prepare_k_digits<encoding::q5_k>;
      k.matvec[slot_of<encoding::q6_k>] = &avx512::matvec_rows_k_digits<encoding::q6_k>;
      k.prepare[slot_of<encoding::q6_k>] = &avx512::prepare_k_digits<encoding::q6_k>;
    }
    if (cpu().avx512vnni) {
      set_avx512_fast<encoding::q8_0>(k);
      set_avx512_fast<encoding::q4_0>(k);
      set_avx512_fast<encoding::q4_1>(k);
      set_avx512_fast<encoding::q5_0>(k);
      set_avx512_fast<encoding::q5_1>(k);
      set_avx512_fast<encoding::q4_k>(k);
      set_avx512_fast<encoding::q5_k>(k);
      set_avx512_fast<encoding::q6_k>(k);
      if (cpu().amd && cpu().family == 0x19) {
        // Zen 4 decodes the K-quants faster with the AVX2 fast matvec (256-bit halves,
        // no 64-byte loads across cache lines): the llama32_1b-shaped Q4_K_M file, fast,
        // ms/token, AVX-512 kernel 44.0-47.9 at 1 thread, AVX2 kernel 42.0-43.4 (2
        // threads: 23.5-28.4 and 24.0-26.9; bench/results/kernels-kquant-steps-zen4.md).
        // Hot, in bench/kernels, the AVX-512 one is as fast or faster (Q6_K 29 against
        // 28 GB/s), so CPUs with full-width 512-bit units (Intel, Zen 5) keep it.
        for (std::size_t i : {slot_of<encoding::q4_k>, slot_of<encoding::q5_k>, slot_of<encoding::q6_k>})
          k.matvec_q8[i] = avx2_table().matvec_q8[i];
      }
    }
    // Decode with byte permutes (4 Q4 blocks per step) on AMD CPUs that have them: on Zen 4
    // Q4_1 hot 29 against 22 GB/s (for Q8_0 the permute measured slower than two 32-byte
    // loads, 29.5 against 37). On the Intel Xeon (family 6 model 167) they made decode
    // slower: SmolLM2-135M fast, ms/token, pairs kernel / permutes, 3 alternating rounds,
    // Q4_1 5.98-6.33 / 7.90-8.23 at 1 thread and 3.56-3.65 / 4.26-4.47 at 2; Q4_0
    // 6.47-6.80 / 7.13-8.05 and 3.71-4.03 / 4.20-4.36 (bench/results/kernels-vbmi-xeon.md).
    // Without VNNI the integer kernels are the AVX2 ones, and so are their crossovers.
    if (cpu().avx512vnni) set_integer_max_batch(k, no_crossover, no_crossover);
    if (cpu().avx512vnni && cpu().avx512vbmi && cpu().amd) {
      k.matvec_q8[slot_of<encoding::q4_0>] = &avx512::matvec_q8_vbmi<encoding::q4_0>;
      k.matvec_q8[slot_of<encoding::q4_1>] = &avx512::matvec_q8_vbmi<encoding::q4_1>;
    }
    return k;
  }();
  return t;
}
#endif

#if defined(TLM_HAVE_AVX512_KERNELS) && defined(TLM_HAVE_AMX_KERNELS)
template <encoding E>
constexpr void set_amx(kernel_table& k) {
  // Codes times scales where the weights are small integers under a scale per 32 (the
  // scaled path: 3 tile products per step instead of 6), from 4 tokens: its time hardly
  // grows up to one token tile, so it beats the AVX2 kernel the avx512 level takes below
  // 16 (amx::scaled_min_batch). The rest decoded and split.
  if constexpr (amx::has_scaled_path<E>) {
    k.matmul[slot_of<E>] = &amx::matmul_rows_scaled<E>;
    k.matmul_min_batch[slot_of<E>] = amx::scaled_min_batch;
  } else if constexpr (is_k_quant(E)) {
    k.matmul[slot_of<E>] = &amx::matmul_rows<&avx2::decode_row_k<E>>;
  } else {
    k.matmul[slot_of<E>] = &amx::matmul_rows<&avx2::decode_row<E>>;
  }
}

// The avx512 table with the exact prefill product on AMX tiles (kernels/amx.hpp) for every
// encoding. Batches under matmul_min_batch (16, one tile of tokens; 4 on the scaled path)
// keep the AVX2 kernel.
inline const kernel_table& amx_table() {
  static const kernel_table t = [] {
    kernel_table k = avx512_table();
    k.level = kernel_level::amx;
    [&]<std::size_t... I>(std::index_sequence<I...>) { (set_amx<table_encodings[I]>(k), ...); }(
        std::make_index_sequence<table_size>{});
    return k;
  }();
  return t;
}
#endif

}  // namespace detail

}  // namespace tlm::kernels
