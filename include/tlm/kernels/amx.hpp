#pragma once
// The amx level's exact prefill product (Intel AMX: TMUL tiles, bf16 dot products).
//
// Why bf16 is exact enough here. Each float32 operand is split into three bf16 pieces,
// x = hi + mid + lo exactly (hi is x truncated to bf16's 8 significant bits, so |mid| <
// 2^-7 |x|; mid rounds the rest, so |lo| <= 2^-16 |x|), and a product x w is summed as 6 of
// the 9 piece products:
//   hi.hi + hi.mid + mid.hi + hi.lo + lo.hi + mid.mid
// The three dropped ones (mid.lo, lo.mid, lo.lo) are under 2^-22 of |x w| together, of
// either sign, and tdpbf16ps forms each bf16 product exactly and accumulates in float32:
// the error is of a float32 dot product's order. tests/test_amx.cpp holds it to 1e-6 of
// sum |x w| against float64 (worst seen: 0.15 of that), ten times inside the tolerance
// tests/test_kernels.cpp holds every level to, and to 3 times the avx512 level's rms error
// (measured 0.64-2.0 there; 0.45 on average over the LoRA check's products, k 32-64). Its
// worst case is small products beside a large one in one instruction: 1 + 31 products of
// 0.375 ulp came to 1 + 6 ulp (an FMA chain: 1 + 0). Training's forward over a quantized
// base uses it too: tests/reference/torch_check_train.py says why its gradients moved.
//
// Layout. Y [batch, rows] = X [batch, cols] W^T. An AMX product C[16, 16] += A[16, 32] .
// B[32, 16] takes A as 16 rows of 32 bf16 and B as 16 rows of 16 bf16 pairs (B row kp holds
// column n's elements 2 kp and 2 kp + 1). The weights are A, as they lie once decoded and
// split; the activations are B, interleaved in pairs once per slice; so C is a block of Y^T
// [16 weight rows, 16 tokens]. Per step of 32 k, a 16-row panel's three pieces stay in tiles
// 5-7 while the pieces of up to 4 token tiles pass through tile 4 into accumulators 0-3.
//
// Blocking. Tokens go in slices of up to 256 (16 tiles), weight rows in chunks of 512, k in
// blocks of 512. A slice's activations are split and interleaved once, for every chunk
// (1/rows of the products). Each weight panel's k block is decoded and split once per
// slice (1/256 of the products at a full slice), while the panel before it is on the tiles:
// tdpbf16ps runs on the tile unit, and the decoding fills the time between (kernels `tiles`
// and `prepare_rows`). A chunk's partial sums, Y^T, stay in an L2-sized float32 buffer
// across k blocks and are transposed into Y at the end, so no tile ever writes outside Y
// and partial tiles need no special case.
//
// What it measured, and what did not help, is in bench/results/prefill-amx-xeon.md: the
// buffers must be 64-byte aligned (aligned_buffer.hpp), and the tile unit and the vector
// units overlap only partly, so the preparation is kept small rather than hidden.
//
// Only reached after the amx level's CPU test (kernels/levels.hpp), which includes the
// operating system's permission to use the tile registers (cpu.hpp).
#if defined(__x86_64__)
#define TLM_HAVE_AMX_KERNELS 1

#include <tlm/format/encoding.hpp>
#include <tlm/kernels/aligned_buffer.hpp>
#include <tlm/kernels/avx512.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

// GCC bug 105593 (as in avx512.hpp): its own intrinsics reported as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tlm::kernels::amx {

inline constexpr std::size_t slice_tokens = 256;  // token rows per slice: 16 tiles
inline constexpr std::size_t chunk_rows = 512;    // weight rows per chunk: 32 panels
inline constexpr std::size_t kc = 512;            // k per block: 16 steps of 32

// The 64-byte tile configuration (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// The tile instructions, as asm of our own rather than GCC 12's intrinsics: its
// _tile_loadconfig names only the first 8 bytes of the configuration as read (so the
// compiler may leave the rest unwritten: a test program here died with SIGILL on tilezero
// that way), and its _tile_loadd names no memory at all (so stores to a buffer may be
// moved past the tile load that reads it). These say what they read and write.
// AT&T and Intel syntax both, as GCC's own headers do.
#define TLM_TILE_LOAD(t, base, stride)                                                      \
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #t "|tileloadd\t%%tmm" #t ", [%0+%1*1]}" \
                   :                                                                        \
                   : "r"(static_cast<const void*>(base)), "r"(static_cast<long>(stride))    \
                   : "memory")
#define TLM_TILE_STORE(t, base, stride)                                                      \
  __asm__ volatile("{tilestored\t%%tmm" #t ", (%0,%1,1)|tilestored\t[%0+%1*1], %%tmm" #t "}" \
                   :                                                                         \
                   : "r"(static_cast<void*>(base)), "r"(static_cast<long>(stride))           \
                   : "memory")
#define TLM_TILE_ZERO(t) __asm__ volatile("tilezero\t%%tmm" #t ::)
// C += A . B: A [16, 32 bf16], B [16 pairs, 16 x 2 bf16], C [16, 16 float].
#define TLM_TILE_DP(c, a, b) \
  __asm__ volatile("{tdpbf16ps\t%%tmm" #b ", %%tmm" #a ", %%tmm" #c "|tdpbf16ps\t%%tmm" #c ", %%tmm" #a ", %%tmm" #b "}" ::)

inline void load_tile_config(const tile_config& c) { __asm__ volatile("ldtilecfg\t%0" : : "m"(c)); }
inline void release_tiles() { __asm__ volatile("tilerelease" ::: "memory"); }

// 32 floats (zero past n) to their three bf16 pieces, 32 of each, at dst[p * piece_stride].
// hi truncates (so a large finite x never rounds up to infinity); mid and lo round to
// nearest even (vcvtne2ps2bf16). x - hi and (x - hi) - mid are exact in float32. A NaN or
// infinity leaves a NaN in mid, so the product is NaN, as a float32 product with infinity
// or NaN is (or is infinite there: the difference only shows on inputs that are already
// not finite). The conversion flushes denormals, so a piece below 2^-126 is lost: an
// absolute error under 2^-126 |w|, far below any tolerance here.
TLM_AMX_INLINE inline __m512 bf16_as_float(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

TLM_AMX_INLINE inline void split32(const float* src, std::size_t n, std::uint16_t* dst, std::size_t piece_stride) {
  const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
  const __mmask16 m1 = n >= 32 ? __mmask16(0xffff) : n <= 16 ? __mmask16(0) : static_cast<__mmask16>((1u << (n - 16)) - 1u);
  const __m512 a = _mm512_maskz_loadu_ps(m0, src), b = _mm512_maskz_loadu_ps(m1, src + 16);
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 ha = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), top));
  const __m512 hb = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b), top));
  const __m512 ra = _mm512_sub_ps(a, ha), rb = _mm512_sub_ps(b, hb);
  const __m512i mid = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(rb, ra));  // a's 16 first
  const __m512 ra2 = _mm512_sub_ps(ra, bf16_as_float(_mm512_castsi512_si256(mid)));
  const __m512 rb2 = _mm512_sub_ps(rb, bf16_as_float(_mm512_extracti64x4_epi64(mid, 1)));
  // hi is bf16 already, so converting it is exact.
  _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hb, ha)));
  _mm512_storeu_si512(dst + piece_stride, mid);
  _mm512_storeu_si512(dst + 2 * piece_stride, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(rb2, ra2)));
}

// out[c] lane n = in[n] lane c: a 16 x 16 transpose of 32-bit elements (here bf16 pairs).
TLM_AMX_INLINE inline void transpose16(const __m512i in[16], __m512i out[16]) {
  __m512i a[16], b[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  // b[4i + e], 128-bit lane L: rows 4i..4i+3 at column 4L + e.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // A 4 x 4 transpose of 128-bit lanes for each e: column 4L + e takes lane L of b[4i + e].
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x88), c1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xdd);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x88);
    const __m512i c3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xdd);
    out[e] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    out[8 + e] = _mm512_shuffle_i32x4(c0, c2, 0xdd);
    out[4 + e] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(c1, c3, 0xdd);
  }
}

// Rows of pieces are kc + 32 bf16 (1088 bytes) apart, not 1024: the 16 rows a tile load
// reads would otherwise fall into a few L1 sets.
inline constexpr std::size_t ldw = kc + 32;
inline constexpr std::size_t tile_elems = kc / 32 * 3 * 512;  // one token tile's pieces of a k block

// A weight panel's k block to prepare: rows [g0, g0 + gn) (the rest of 16 zero) of W,
// columns [k0, k0 + kn), decoded into `panel` [16, kc] and split into `out`, row n of piece
// p at out + (16 p + n) ldw.
// `ahead` rows of the panel after it (the same k block) are prefetched meanwhile.
struct panel_job {
  encoding enc;
  const std::byte* w;
  std::size_t rb, bv, bb, g0, gn, k0, kn, ahead;
  float* panel;
  std::uint16_t* out;
};

template <void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
TLM_AMX_INLINE inline void prepare_rows(const panel_job& j, std::size_t n0, std::size_t n1) {
  const std::size_t steps = (j.kn + 31) / 32;
  const std::size_t bytes = (j.kn + j.bv - 1) / j.bv * j.bb, offset = j.k0 / j.bv * j.bb;
  for (std::size_t n = n0; n < n1; ++n) {
    // A panel's k block is 16 runs of a few cache lines, rb bytes apart, a pattern the
    // hardware prefetcher does not follow; a prompt of a few tiles reads each weight once,
    // from memory, so the next panel's rows are fetched while this one is prepared (the 1B
    // Q4_K_M file, a 61-token prompt, 1 thread, alternating: 36-49 tokens/s without, 48-52
    // with).
    if (n < j.ahead) {
      const char* p = reinterpret_cast<const char*>(j.w + (j.g0 + 16 + n) * j.rb + offset);
      for (std::size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    }
    float* row = j.panel + n * kc;
    if (n < j.gn) Decode(j.enc, j.w + (j.g0 + n) * j.rb + j.k0 / j.bv * j.bb, row, j.kn);
    const std::size_t valid = n < j.gn ? j.kn : 0;
    for (std::size_t s = 0; s < steps; ++s)
      split32(row + 32 * s, valid > 32 * s ? valid - 32 * s : 0, j.out + n * ldw + 32 * s, 16 * ldw);
  }
}

// One k block of one weight panel against NT token tiles. C tile t is the block
// Y^T [16 rows, 16 tokens] of token tile t, kept in c + 16 t (stride ldc floats) between
// k blocks, or zero when `first`. wp: the panel's pieces, row n of piece p at
// wp + (16 p + n) ldw; xp: the token tiles' pieces [tile][kc / 32][3][16 pairs][16 tokens][2].
// `next` (may be null): the panel to prepare meanwhile, a few rows after each step's
// products are issued. The tile unit works through them on its own while the vector units
// decode, so the two overlap instead of taking turns: at 64 tokens, decoding and splitting
// a panel takes about as long as its products.
// noinline: one instance per NT keeps the tile numbers constants in a small loop.
template <int NT, void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
[[gnu::noinline]] TLM_AMX_FN inline void tiles(const std::uint16_t* wp, const std::uint16_t* xp, std::size_t steps,
                                               float* c, std::size_t ldc, bool first, const panel_job* next) {
  const std::size_t w_stride = ldw * 2, piece = 16 * ldw, c_stride = ldc * 4;
  const std::size_t rows_per_step = (16 + steps - 1) / steps;
  std::size_t prepared = 0;
  if (first) {
    TLM_TILE_ZERO(0);
    if constexpr (NT > 1) TLM_TILE_ZERO(1);
    if constexpr (NT > 2) TLM_TILE_ZERO(2);
    if constexpr (NT > 3) TLM_TILE_ZERO(3);
  } else {
    TLM_TILE_LOAD(0, c, c_stride);
    if constexpr (NT > 1) TLM_TILE_LOAD(1, c + 16, c_stride);
    if constexpr (NT > 2) TLM_TILE_LOAD(2, c + 32, c_stride);
    if constexpr (NT > 3) TLM_TILE_LOAD(3, c + 48, c_stride);
  }
  for (std::size_t s = 0; s < steps; ++s) {
    TLM_TILE_LOAD(5, wp + 32 * s, w_stride);              // weights hi
    TLM_TILE_LOAD(6, wp + piece + 32 * s, w_stride);      // mid
    TLM_TILE_LOAD(7, wp + 2 * piece + 32 * s, w_stride);  // lo
    // Per token tile: its lo piece meets the weights' hi, mid meets mid and hi, hi meets all
    // three (the small products first).
#define TLM_AMX_TOKEN_TILE(T)                                   \
  if constexpr (NT > T) {                                       \
    const std::uint16_t* xt = xp + (T) * tile_elems + s * 1536; \
    TLM_TILE_LOAD(4, xt + 1024, 64);                              \
    TLM_TILE_DP(T, 5, 4);                                    \
    TLM_TILE_LOAD(4, xt + 512, 64);                               \
    TLM_TILE_DP(T, 6, 4);                                    \
    TLM_TILE_DP(T, 5, 4);                                    \
    TLM_TILE_LOAD(4, xt, 64);                                     \
    TLM_TILE_DP(T, 7, 4);                                    \
    TLM_TILE_DP(T, 6, 4);                                    \
    TLM_TILE_DP(T, 5, 4);                                    \
  }
    TLM_AMX_TOKEN_TILE(0)
    TLM_AMX_TOKEN_TILE(1)
    TLM_AMX_TOKEN_TILE(2)
    TLM_AMX_TOKEN_TILE(3)
#undef TLM_AMX_TOKEN_TILE
    if (next != nullptr && prepared < 16) {
      const std::size_t upto = std::min<std::size_t>(16, prepared + rows_per_step);
      prepare_rows<Decode>(*next, prepared, upto);
      prepared = upto;
    }
  }
  if (next != nullptr && prepared < 16) prepare_rows<Decode>(*next, prepared, 16);
  TLM_TILE_STORE(0, c, c_stride);
  if constexpr (NT > 1) TLM_TILE_STORE(1, c + 16, c_stride);
  if constexpr (NT > 2) TLM_TILE_STORE(2, c + 32, c_stride);
  if constexpr (NT > 3) TLM_TILE_STORE(3, c + 48, c_stride);
}

// Below two tiles of tokens the weights' preparation is spread over too few products: at 16
// tokens, 1 thread, the tiles ran at 0.76-0.93x the avx512 kernel's speed on seven of the
// eight shapes measured (bench/results/prefill-amx-xeon.md), so such a batch takes that kernel. (The table sends
// batches under 16 to the AVX2 one before they get here.)
inline constexpr std::size_t min_batch = 32;

// Rows [r0, r1) of Y [batch, rows] = X [batch, cols] W^T, W's row r at w + r * rb.
template <void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
TLM_AMX_FN inline void matmul_rows(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                   std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                   std::size_t batch) {
  if (batch < min_batch) {
    avx512::matmul_rows<Decode>(enc, w, rb, x, y, r0, r1, rows, cols, batch);
    return;
  }
  const std::size_t bv = traits(enc).block_values, bb = traits(enc).block_bytes;
  // The chunk's partial sums [chunk_rows, ldc], Y transposed; rows 1088 bytes apart, for the
  // same reason as ldw.
  constexpr std::size_t ldc = slice_tokens + 16;
  // Every tile row is 64 bytes at a multiple of 64 from these (aligned_buffer.hpp says why).
  thread_local aligned_buffer<float> panel_buffer, cbuf_buffer;
  thread_local aligned_buffer<std::uint16_t> wsplit_buffer, xsplit_buffer, xpack_buffer;
  const std::size_t k_blocks = (cols + kc - 1) / kc;
  // A token tile's pieces, rows ldx apart: 64 bytes more than a multiple of 64 so the
  // transposes' 16 row loads do not share L1 sets.
  const std::size_t ldx = k_blocks * kc + 32;
  float* const panel = panel_buffer.get(16 * kc);                     // [16, kc] decoded weights
  std::uint16_t* const wsplit = wsplit_buffer.get(2 * 3 * 16 * ldw);  // [2][3][16][ldw] this panel, the next
  std::uint16_t* const xsplit = xsplit_buffer.get(3 * 16 * ldx);      // [3][16][ldx] one token tile, all k
  // The slice's activations, every k block: [k_blocks][token tiles][kc / 32][3][16 pairs][16 tokens][2].
  std::uint16_t* const xpack = xpack_buffer.get(k_blocks * (slice_tokens / 16) * tile_elems);
  float* const cbuf = cbuf_buffer.get(chunk_rows * ldc);  // [chunk_rows, ldc]

  tile_config cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  load_tile_config(cfg);

  for (std::size_t b0 = 0; b0 < batch; b0 += slice_tokens) {
    const std::size_t nb = std::min(slice_tokens, batch - b0);
    const std::size_t token_tiles = (nb + 15) / 16;
    // The slice's activations, split, then interleaved in pairs, once for all the chunks:
    // xpack[kb][tile][s][p][kp][t] = piece p of X[t][kc kb + 32 s + 2 kp ..]. Tokens past the
    // batch and k past cols are zero. Each token row is read front to back, once.
    for (std::size_t tt = 0; tt < token_tiles; ++tt) {
      for (std::size_t t = 0; t < 16; ++t) {
        const std::size_t b = tt * 16 + t;
        const float* src = x + (b0 + b) * cols;
        const std::size_t valid = b < nb ? cols : 0;
        for (std::size_t k = 0; k < k_blocks * kc; k += 32)
          split32(src + k, valid > k ? valid - k : 0, xsplit + t * ldx + k, 16 * ldx);
      }
      for (std::size_t kb = 0; kb < k_blocks; ++kb) {
        std::uint16_t* block = xpack + (kb * token_tiles + tt) * tile_elems;
        for (std::size_t s = 0; s < kc / 32; ++s) {
          for (std::size_t p = 0; p < 3; ++p) {
            __m512i in[16], out[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; ++t)
              in[t] = _mm512_loadu_si512(xsplit + (p * 16 + static_cast<std::size_t>(t)) * ldx + kb * kc + 32 * s);
            transpose16(in, out);
            std::uint16_t* dst = block + (s * 3 + p) * 512;
#pragma GCC unroll 16
            for (int kp = 0; kp < 16; ++kp) _mm512_storeu_si512(dst + 32 * kp, out[kp]);
          }
        }
      }
    }
    for (std::size_t c0 = r0; c0 < r1; c0 += chunk_rows) {
      const std::size_t c1 = std::min(r1, c0 + chunk_rows);
      for (std::size_t k0 = 0; k0 < cols; k0 += kc) {
        const std::size_t kn = std::min(kc, cols - k0), steps = (kn + 31) / 32;
        const std::uint16_t* xblock = xpack + (k0 / kc) * token_tiles * tile_elems;
        auto job = [&](std::size_t g0, std::size_t buffer) {
          const std::size_t ahead = g0 + 16 < c1 ? std::min<std::size_t>(16, c1 - g0 - 16) : 0;
          return panel_job{enc,   w,  rb, bv, bb, g0, std::min<std::size_t>(16, c1 - g0), k0, kn, ahead,
                           panel, wsplit + buffer * 3 * 16 * ldw};
        };
        {
          const panel_job j0 = job(c0, 0);
          prepare_rows<Decode>(j0, 0, 16);
        }
        std::size_t buffer = 0;
        for (std::size_t g0 = c0; g0 < c1; g0 += 16, buffer ^= 1) {
          const bool has_next = g0 + 16 < c1;
          const panel_job next = has_next ? job(g0 + 16, buffer ^ 1) : panel_job{};
          const std::uint16_t* wp = wsplit + buffer * 3 * 16 * ldw;
          const bool first = k0 == 0;
          float* c = cbuf + (g0 - c0) * ldc;
          for (std::size_t t0 = 0; t0 < token_tiles; t0 += 4) {
            const std::uint16_t* xp = xblock + t0 * tile_elems;
            // The next panel is prepared during the first group of token tiles.
            const panel_job* prep = has_next && t0 == 0 ? &next : nullptr;
            switch (std::min<std::size_t>(4, token_tiles - t0)) {
              case 1: tiles<1, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              case 2: tiles<2, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              case 3: tiles<3, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              default: tiles<4, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
            }
          }
        }
      }
      // Y^T blocks back into Y, 16 x 16 at a time (an element-wise gather measured a third of
      // the time outside the tiles at 512 tokens).
      for (std::size_t rr = 0; rr < c1 - c0; rr += 16) {
        const std::size_t nr = std::min<std::size_t>(16, c1 - c0 - rr);
        const __mmask16 cols_mask = static_cast<__mmask16>((1u << nr) - 1u);
        for (std::size_t tb = 0; tb < nb; tb += 16) {
          __m512i in[16], out[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) in[i] = _mm512_load_si512(cbuf + (rr + static_cast<std::size_t>(i)) * ldc + tb);
          transpose16(in, out);
          const std::size_t n = std::min<std::size_t>(16, nb - tb);
          for (std::size_t j = 0; j < n; ++j)
            _mm512_mask_storeu_ps(y + (b0 + tb + j) * rows + c0 + rr, cols_mask, _mm512_castsi512_ps(out[j]));
        }
      }
    }
  }
  // The tile registers back to their initial state: a thread switched out after this
  // saves none of their 8 KiB.
  release_tiles();
}

}  // namespace tlm::kernels::amx

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif
