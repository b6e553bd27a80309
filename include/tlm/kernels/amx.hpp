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
// The quantized encodings with blocks of 32 (all but Q6_K) take the scaled path at the end
// of this file: their integer codes are exact in one bf16 piece, so a step is 3 products.
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

// The chunk's partial sums [chunk_rows, ldc], Y transposed; rows 1088 bytes apart, for the
// same reason as ldw.
inline constexpr std::size_t ldc = slice_tokens + 16;

// One slice of tokens as the tiles take it, for every chunk of weight rows.
struct slice {
  std::size_t b0, nb, token_tiles;
  // [k_blocks][token tiles][kc / 32][3][16 pairs][16 tokens][2]: piece p of X[t][kc kb + 32 s + 2 kp ..].
  const std::uint16_t* xpack;
  // [cols / 32][slice_tokens]: each token's sum over each block of 32 k (when asked for).
  const float* xsum;
};

// Rows [r0, r1) of Y [batch, rows] = X [batch, cols] W^T through tiles, slice by slice:
// the activations split and interleaved once per slice (with their sums of 32 when `sums`),
// then chunk(c0, c1, slice, cbuf) leaves Y^T [c1 - c0, tokens] in cbuf (stride ldc), which
// goes back into Y 16 x 16 at a time.
template <class Chunk>
TLM_AMX_INLINE inline void run_slices(const float* x, float* y, std::size_t r0, std::size_t r1, std::size_t rows,
                                      std::size_t cols, std::size_t batch, bool sums, Chunk&& chunk) {
  // Every tile row is 64 bytes at a multiple of 64 from these (aligned_buffer.hpp says why).
  thread_local aligned_buffer<float> cbuf_buffer, xsum_buffer;
  thread_local aligned_buffer<std::uint16_t> xsplit_buffer, xpack_buffer;
  const std::size_t k_blocks = (cols + kc - 1) / kc;
  // A token tile's pieces, rows ldx apart: 64 bytes more than a multiple of 64 so the
  // transposes' 16 row loads do not share L1 sets.
  const std::size_t ldx = k_blocks * kc + 32;
  std::uint16_t* const xsplit = xsplit_buffer.get(3 * 16 * ldx);  // [3][16][ldx] one token tile, all k
  std::uint16_t* const xpack = xpack_buffer.get(k_blocks * (slice_tokens / 16) * tile_elems);
  float* const xsum = sums ? xsum_buffer.get(k_blocks * (kc / 32) * slice_tokens) : nullptr;
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
    // Tokens past the batch and k past cols are zero. Each token row is read front to back, once.
    for (std::size_t tt = 0; tt < token_tiles; ++tt) {
      for (std::size_t t = 0; t < 16; ++t) {
        const std::size_t b = tt * 16 + t;
        const float* src = x + (b0 + b) * cols;
        const std::size_t valid = b < nb ? cols : 0;
        for (std::size_t k = 0; k < k_blocks * kc; k += 32) {
          const std::size_t n = valid > k ? valid - k : 0;
          split32(src + k, n, xsplit + t * ldx + k, 16 * ldx);
          if (sums) xsum[k / 32 * slice_tokens + b] = n >= 32 ? _mm512_reduce_add_ps(_mm512_add_ps(
                                                                    _mm512_loadu_ps(src + k), _mm512_loadu_ps(src + k + 16)))
                                                              : 0.0f;  // the scaled path's cols are whole blocks
        }
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
    const slice sl{b0, nb, token_tiles, xpack, xsum};
    for (std::size_t c0 = r0; c0 < r1; c0 += chunk_rows) {
      const std::size_t c1 = std::min(r1, c0 + chunk_rows);
      chunk(c0, c1, sl, cbuf);
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

// Rows [r0, r1) of Y [batch, rows] = X [batch, cols] W^T, W's row r at w + r * rb, with the
// weights decoded to float32 and split in three pieces (6 products per step).
template <void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
TLM_AMX_FN inline void matmul_rows(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                   std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                   std::size_t batch) {
  if (batch < min_batch) {
    avx512::matmul_rows<Decode>(enc, w, rb, x, y, r0, r1, rows, cols, batch);
    return;
  }
  const std::size_t bv = traits(enc).block_values, bb = traits(enc).block_bytes;
  thread_local aligned_buffer<float> panel_buffer;
  thread_local aligned_buffer<std::uint16_t> wsplit_buffer;
  float* const panel = panel_buffer.get(16 * kc);                     // [16, kc] decoded weights
  std::uint16_t* const wsplit = wsplit_buffer.get(2 * 3 * 16 * ldw);  // [2][3][16][ldw] this panel, the next
  // A struct, not a lambda: a lambda's body does not take the enclosing function's target.
  struct chunk_fn {
    encoding enc;
    const std::byte* w;
    std::size_t rb, bv, bb, cols;
    float* panel;
    std::uint16_t* wsplit;
    TLM_AMX_INLINE void operator()(std::size_t c0, std::size_t c1, const slice& sl, float* cbuf) const {
      for (std::size_t k0 = 0; k0 < cols; k0 += kc) {
        const std::size_t kn = std::min(kc, cols - k0), steps = (kn + 31) / 32;
        const std::uint16_t* xblock = sl.xpack + (k0 / kc) * sl.token_tiles * tile_elems;
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
          for (std::size_t t0 = 0; t0 < sl.token_tiles; t0 += 4) {
            const std::uint16_t* xp = xblock + t0 * tile_elems;
            // The next panel is prepared during the first group of token tiles.
            const panel_job* prep = has_next && t0 == 0 ? &next : nullptr;
            switch (std::min<std::size_t>(4, sl.token_tiles - t0)) {
              case 1: tiles<1, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              case 2: tiles<2, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              case 3: tiles<3, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
              default: tiles<4, Decode>(wp, xp, steps, c + 16 * t0, ldc, first, prep); break;
            }
          }
        }
      }
    }
  };
  run_slices(x, y, r0, r1, rows, cols, batch, false, chunk_fn{enc, w, rb, bv, bb, cols, panel, wsplit});
}

// ---- The scaled path: codes on the tiles, scales on the vector units -------------------
//
// Every encoding whose weights are w = a c + b over blocks of 32 k, with small integer codes
// c (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: a block; Q4_K, Q5_K: a sub-block) takes this path
// instead. The codes are exact in bf16 (|c| <= 128: 8 significant bits), so the weights
// need one piece, not three, and a step of 32 k is 3 products (the codes against x's three
// pieces) instead of 6. Those 3 are all the piece products there are, each exact, so the
// only rounding inside a step is tdpbf16ps's float32 accumulation. The tiles cannot apply
// a row's scale a, which changes every step: each step's 16 x 16 sums S go to memory and a
// vector multiply-add folds them into the chunk's sums, a_n S[n][t] + b_n sum(x_t), with
// each token's sums of 32 formed once per slice. That is the exact matvec's sum (dsc (c.x)
// - dmn sum(x), avx2_kquant.hpp), in another order than dequantize_row's; tests/test_amx.cpp
// holds both paths to the same bounds.
// Q6_K (blocks of 16 under an 8-bit scale: a c reaches 13 bits) keeps the split path, as do
// F32, F16 and BF16.

// The weight rows a scaled step takes at once: two panels of 16, so each load of a token
// tile's pieces feeds 6 products instead of 3. (The 8 tiles: 2 of codes, 2 of pieces, 2
// pairs of sums, alternating between token tiles.) Loading the pieces from L2 once per
// product cost about a fifth of the time (1B ffn_gate, 64 tokens: 8.8 ms against 6.9 with
// the pieces kept in L1, a measurement-only variant).
inline constexpr std::size_t group_rows = 32;
inline constexpr std::size_t panel_scales = 2 * (kc / 32) * 16;  // a panel's a and b, [2][kc / 32][16]
inline constexpr std::size_t group_scales = 2 * panel_scales;

// A group's k block to prepare for the scaled path: rows [g0, g0 + gn) (the rest of the
// span, 16 or 32, zero) of W, columns [k0, k0 + kn) (whole blocks): row n's codes at codes
// + n ldw; its block s's a and b at scales[panel_scales p + 16 s + r] and the same plus
// (kc / 32) 16, with p = n / 16 and r = n % 16.
struct scaled_job {
  const std::byte* w;
  std::size_t rb, g0, gn, span, k0, kn, ahead;
  std::uint16_t* codes;
  float* scales;
};

// 32 signed byte codes to bf16 (exact: at most 8 significant bits).
TLM_AMX_INLINE inline void codes_to_bf16(__m256i c, std::uint16_t* out) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c, 1)));
  _mm512_storeu_si512(out, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// Columns [k0, k0 + kn) of one row as codes, scales and biases (stride 16), per encoding.
// Q4_0, Q5_0, Q8_0: w = d c with c signed (so b = 0, not -8 d: no cancellation in b sum(x));
// Q4_1, Q5_1: w = d c + m; Q4_K, Q5_K: w = (d sc) c - dmin m per sub-block of 32.
template <encoding E>
TLM_AMX_INLINE inline void scaled_codes(const std::byte* row, std::size_t k0, std::size_t kn, std::uint16_t* codes,
                                        float* scale, float* bias) {
  constexpr std::size_t bb = traits(E).block_bytes;
  if constexpr (is_k_quant(E)) {
    for (std::size_t sb = 0; sb < kn / 256; ++sb) {
      const std::byte* p = row + (k0 / 256 + sb) * bb;
      __m256 dsc, dmn;
      avx2::k_scales8(p, dsc, dmn);
      alignas(32) float a[8], m[8];
      _mm256_store_ps(a, dsc);
      _mm256_store_ps(m, dmn);
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const std::size_t step = 8 * sb + static_cast<std::size_t>(s);
        scale[16 * step] = a[s];
        bias[16 * step] = -m[s];
        codes_to_bf16(avx2::k_codes32<E>(p, s), codes + 32 * step);
      }
    }
  } else {
    constexpr bool has_min = E == encoding::q4_1 || E == encoding::q5_1;
    for (std::size_t b = 0; b < kn / 32; ++b) {
      const std::byte* p = row + (k0 / 32 + b) * bb;
      scale[16 * b] = avx512::half_at(p);
      if constexpr (has_min) bias[16 * b] = avx512::half_at(p + 2);
      codes_to_bf16(avx2::codes32<E>(p), codes + 32 * b);
    }
  }
}

// The encodings the scaled path takes (kernels/table.hpp asks this).
template <encoding E>
inline constexpr bool has_scaled_path = E == encoding::q4_0 || E == encoding::q4_1 || E == encoding::q5_0 ||
                                        E == encoding::q5_1 || E == encoding::q8_0 || E == encoding::q4_k ||
                                        E == encoding::q5_k;

template <encoding E>
inline constexpr bool scaled_has_bias = is_k_quant(E) || E == encoding::q4_1 || E == encoding::q5_1;

template <encoding E>
TLM_AMX_INLINE inline void prepare_scaled_rows(const scaled_job& j, std::size_t n0, std::size_t n1) {
  constexpr std::size_t bv = traits(E).block_values, bb = traits(E).block_bytes;
  const std::size_t bytes = j.kn / bv * bb, offset = j.k0 / bv * bb;
  for (std::size_t n = n0; n < n1; ++n) {
    // As prepare_rows: the next group's rows fetched while this one is prepared.
    if (n < j.ahead) {
      const char* p = reinterpret_cast<const char*>(j.w + (j.g0 + j.span + n) * j.rb + offset);
      for (std::size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    }
    float* scale = j.scales + n / 16 * panel_scales + n % 16;
    float* bias = scale + kc / 2;
    if (n < j.gn) {
      scaled_codes<E>(j.w + (j.g0 + n) * j.rb, j.k0, j.kn, j.codes + n * ldw, scale, bias);
    } else {
      std::memset(j.codes + n * ldw, 0, j.kn * sizeof(std::uint16_t));
      for (std::size_t s = 0; s < j.kn / 32; ++s) scale[16 * s] = bias[16 * s] = 0.0f;
    }
  }
}

// Step s's stored sums of one panel (token tile t's [16 rows][16 tokens] at sums + t_stride
// t) folded into the chunk's sums: c[n][t] += a_n S[n][t] (+ b_n sum(x_t)).
template <encoding E>
TLM_AMX_INLINE inline void fold(const float* sums, std::size_t t_stride, const float* scale, const float* bias,
                                const float* xs, std::size_t s, float* c, std::size_t nt) {
  for (std::size_t t = 0; t < nt; ++t) {
    __m512 xv = _mm512_setzero_ps();
    if constexpr (scaled_has_bias<E>) xv = _mm512_loadu_ps(xs + s * slice_tokens + 16 * t);
#pragma GCC unroll 16
    for (std::size_t n = 0; n < 16; ++n) {
      float* a = c + n * ldc + 16 * t;
      __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(scale[16 * s + n]), _mm512_load_ps(sums + t_stride * t + 16 * n),
                                 _mm512_load_ps(a));
      if constexpr (scaled_has_bias<E>) v = _mm512_fmadd_ps(_mm512_set1_ps(bias[16 * s + n]), xv, v);
      _mm512_store_ps(a, v);
    }
  }
}

// fold for each of P panels: step s's sums at sums [nt][P][16][16], the group's scales.
template <int P, encoding E>
TLM_AMX_INLINE inline void fold_panels(const float* sums, const float* scales, const float* xs, std::size_t s, float* c,
                                       std::size_t nt) {
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p) {
    const float* scale = scales + static_cast<std::size_t>(p) * panel_scales;
    fold<E>(sums + 256 * p, 256 * P, scale, scale + kc / 2, xs, s, c + 16 * static_cast<std::size_t>(p) * ldc, nt);
  }
}

// One k block of P weight panels (1 or 2) against nt token tiles (1-4), into the chunk's sums
// (panel p's rows at c + 16 p ldc, token tile t at + 16 t; set, not added to, when `first`).
// wc: the group's codes, row n at wc + n ldw; scales: as scaled_job's; xp: the token tiles'
// pieces (as tiles'); xs: the tokens' sums of the k block's first 32, step s's at xs + s
// slice_tokens; tmp: [2][nt][P][16][16] floats. nt is an argument, not a template
// parameter: one instance per P and encoding, not 4 (clang's sanitizer build of the
// kernels took 239 s with 56 instances, 103 s with 14; the speed is the same). A step's
// sums are stored while the next step's products run and folded in after them, so the
// vector units work beside the tile unit instead of waiting on it.
template <int P, encoding E>
[[gnu::noinline]] TLM_AMX_FN inline void scaled_tiles(const std::uint16_t* wc, const float* scales,
                                                      const std::uint16_t* xp, const float* xs, std::size_t steps,
                                                      float* c, bool first, float* tmp, const scaled_job* next,
                                                      std::size_t nt) {
  const std::size_t w_stride = ldw * 2, half = nt * P * 256;
  const std::size_t span = next != nullptr ? next->span : 0, rows_per_step = (span + steps - 1) / steps;
  std::size_t prepared = 0;
  if (first) {
    for (std::size_t n = 0; n < 16 * P; ++n)
      for (std::size_t t = 0; t < nt; ++t) _mm512_store_ps(c + n * ldc + 16 * t, _mm512_setzero_ps());
  }
  for (std::size_t s = 0; s < steps; ++s) {
    TLM_TILE_LOAD(0, wc + 32 * s, w_stride);
    if constexpr (P > 1) TLM_TILE_LOAD(1, wc + 16 * ldw + 32 * s, w_stride);
    float* sums = tmp + (s & 1) * half;
    // Each token tile's three pieces, the small ones first, through tiles 2 and 3; its sums
    // in tiles 4-5 or 6-7 (alternating, so the next token tile need not wait for the
    // stores).
#define TLM_AMX_SCALED_TILE(T, CA, CB)                                      \
  {                                                                         \
    const std::uint16_t* xt = xp + (T) * tile_elems + s * 1536;             \
    TLM_TILE_ZERO(CA);                                                      \
    if constexpr (P > 1) TLM_TILE_ZERO(CB);                                 \
    TLM_TILE_LOAD(2, xt + 1024, 64);                                        \
    TLM_TILE_DP(CA, 0, 2);                                                  \
    if constexpr (P > 1) TLM_TILE_DP(CB, 1, 2);                             \
    TLM_TILE_LOAD(3, xt + 512, 64);                                         \
    TLM_TILE_DP(CA, 0, 3);                                                  \
    if constexpr (P > 1) TLM_TILE_DP(CB, 1, 3);                             \
    TLM_TILE_LOAD(2, xt, 64);                                               \
    TLM_TILE_DP(CA, 0, 2);                                                  \
    if constexpr (P > 1) TLM_TILE_DP(CB, 1, 2);                             \
    TLM_TILE_STORE(CA, sums + (T) * P * 256, 64);                           \
    if constexpr (P > 1) TLM_TILE_STORE(CB, sums + (T) * P * 256 + 256, 64); \
  }
    for (std::size_t t = 0; t < nt; t += 2) {
      TLM_AMX_SCALED_TILE(t, 4, 5)
      if (t + 1 < nt) TLM_AMX_SCALED_TILE(t + 1, 6, 7)
    }
#undef TLM_AMX_SCALED_TILE
    if (s > 0) fold_panels<P, E>(tmp + ((s - 1) & 1) * half, scales, xs, s - 1, c, nt);
    if (prepared < span) {
      const std::size_t upto = std::min(span, prepared + rows_per_step);
      prepare_scaled_rows<E>(*next, prepared, upto);
      prepared = upto;
    }
  }
  if (prepared < span) prepare_scaled_rows<E>(*next, prepared, span);
  fold_panels<P, E>(tmp + ((steps - 1) & 1) * half, scales, xs, steps - 1, c, nt);
}

// The fewest tokens the table sends to the scaled path: its time hardly grows up to one
// token tile, and from 4 tokens it beat the AVX2 kernel below it (bench/results/
// prefill-amx-scaled-xeon.md: 1.03-1.35x at 4 tokens, 1.45-1.94x at 8; 0.85-1.0x at 2).
inline constexpr std::size_t scaled_min_batch = 4;

// Rows [r0, r1) of Y [batch, rows] = X [batch, cols] W^T on the scaled path.
template <encoding E>
TLM_AMX_FN inline void matmul_rows_scaled(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                          std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                          std::size_t batch) {
  if (batch < scaled_min_batch) {  // not from the table's dispatch (the AVX2 kernel takes these)
    if constexpr (is_k_quant(E)) avx512::matmul_rows<&avx2::decode_row_k<E>>(enc, w, rb, x, y, r0, r1, rows, cols, batch);
    else avx512::matmul_rows<&avx2::decode_row<E>>(enc, w, rb, x, y, r0, r1, rows, cols, batch);
    return;
  }
  thread_local aligned_buffer<std::uint16_t> codes_buffer;
  thread_local aligned_buffer<float> scale_buffer, tmp_buffer;
  std::uint16_t* const codes = codes_buffer.get(2 * group_rows * ldw);  // [2][32][ldw] this group, the next
  float* const scales = scale_buffer.get(2 * group_scales);  // [2][2 panels][a, b][kc / 32][16]
  float* const tmp = tmp_buffer.get(2 * 4 * 2 * 256);                   // [2][4 token tiles][2 panels][16][16]
  // A struct, not a lambda: a lambda's body does not take the enclosing function's target.
  struct chunk_fn {
    const std::byte* w;
    std::size_t rb, cols;
    std::uint16_t* codes;
    float *scales, *tmp;
    TLM_AMX_INLINE void operator()(std::size_t c0, std::size_t c1, const slice& sl, float* cbuf) const {
      for (std::size_t k0 = 0; k0 < cols; k0 += kc) {
        const std::size_t kn = std::min(kc, cols - k0), steps = kn / 32;
        const std::uint16_t* xblock = sl.xpack + (k0 / kc) * sl.token_tiles * tile_elems;
        const float* xs = sl.xsum != nullptr ? sl.xsum + k0 / 32 * slice_tokens : nullptr;
        // A group: two panels, or one where a single panel's rows are left.
        auto job = [&](std::size_t g0, std::size_t buffer) {
          const std::size_t left = c1 - g0, span = left > 16 ? group_rows : 16;
          const std::size_t after = left > span ? left - span : 0;
          return scaled_job{w,  rb, g0, std::min(span, left), span, k0, kn, std::min(span, after),
                            codes + buffer * group_rows * ldw, scales + buffer * group_scales};
        };
        {
          const scaled_job j0 = job(c0, 0);
          prepare_scaled_rows<E>(j0, 0, j0.span);
        }
        std::size_t buffer = 0;
        for (std::size_t g0 = c0; g0 < c1; buffer ^= 1) {
          const std::size_t span = c1 - g0 > 16 ? group_rows : 16;
          const bool has_next = g0 + span < c1;
          const scaled_job next = has_next ? job(g0 + span, buffer ^ 1) : scaled_job{};
          const std::uint16_t* wc = codes + buffer * group_rows * ldw;
          const float* sc = scales + buffer * group_scales;
          const bool first = k0 == 0;
          float* c = cbuf + (g0 - c0) * ldc;
          for (std::size_t t0 = 0; t0 < sl.token_tiles; t0 += 4) {
            const std::uint16_t* xp = xblock + t0 * tile_elems;
            const float* xst = xs != nullptr ? xs + 16 * t0 : nullptr;
            const scaled_job* prep = has_next && t0 == 0 ? &next : nullptr;
            float* ct = c + 16 * t0;
            const std::size_t nt = std::min<std::size_t>(4, sl.token_tiles - t0);
            if (span == group_rows) scaled_tiles<2, E>(wc, sc, xp, xst, steps, ct, first, tmp, prep, nt);
            else scaled_tiles<1, E>(wc, sc, xp, xst, steps, ct, first, tmp, prep, nt);
          }
          g0 += span;
        }
      }
    }
  };
  run_slices(x, y, r0, r1, rows, cols, batch, scaled_has_bias<E>, chunk_fn{w, rb, cols, codes, scales, tmp});
}

}  // namespace tlm::kernels::amx

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif
