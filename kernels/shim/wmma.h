// nvcuda::wmma (16x16x16, bf16 or f16 in, f32 accumulate) for the SIMT shim. The API leaves the
// mapping of fragment elements to lanes unspecified, so here every lane holds a whole fragment,
// in a scrambled order: kernel code may touch fragments only through load/store/fill/mma_sync
// and element-wise operations uniform over x[i] (the portable-subset test enforces that), and
// code that assumes a layout reads the wrong values. Loads and mma_sync are per lane; a store
// is split across the warp's lanes (lane (5e + 1) mod 32 writes element e), so reading
// what another lane stored without a __syncwarp is a race ThreadSanitizer reports.
#pragma once
#include "cuda_shim.h"

#include <type_traits>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
// WMMA's loads and stores require 256-bit aligned pointers; a misaligned one is undefined on
// the device, so here it ends the launch.
inline void aligned(const void* p) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
        terse_shim::fail("a wmma load or store at a pointer that is not 32-byte aligned");
}
// WMMA's leading dimension must be a multiple of 16 bytes (8 bf16/f16 elements, 4 floats);
// the device's behaviour with another is undefined, so here it ends the launch.
template <typename T>
inline void ldm_ok(unsigned ldm) {
    if ((ldm * sizeof(T)) % 16 != 0)
        terse_shim::fail("a wmma load or store with a leading dimension that is not a multiple of 16 bytes");
}
// Where element (r, c) of a rows x cols fragment lives in x[]: a fixed permutation (7 is
// coprime with every power of two).
constexpr int slot(int r, int c, int cols, int n) { return ((r * cols + c) * 7 + 3) % n; }
template <typename Use, int M, int N, int K>
struct shape {
    static constexpr int rows = M, cols = N;
};
template <int M, int N, int K>
struct shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(__half v) { return __half2float(v); }
template <typename T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
inline __half from_float<__half>(float v) { return __float2half(v); }
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static constexpr int rows = detail::shape<Use, M, N, K>::rows;
    static constexpr int cols = detail::shape<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    T x[num_elements];
    // Element (r, c): for the emulation's own functions only.
    T& at(int r, int c) { return x[detail::slot(r, c, cols, num_elements)]; }
    const T& at(int r, int c) const { return x[detail::slot(r, c, cols, num_elements)]; }
};

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, T v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

// matrix_a / matrix_b from memory in the fragment's layout, leading dimension ldm (elements).
template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
    detail::aligned(p);
    detail::ldm_ok<T>(ldm);
    constexpr bool row = !std::is_same<L, col_major>::value;
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.at(r, c) = row ? p[r * ldm + c] : p[c * ldm + r];
}

// The accumulator from memory, in the given layout.
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float, void>& f, const float* p,
                             unsigned ldm, layout_t layout) {
    detail::aligned(p);
    detail::ldm_ok<float>(ldm);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            f.at(r, c) = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

// The accumulator to memory: each lane writes its share of the elements (see the top).
template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float, void>& f,
                              unsigned ldm, layout_t layout) {
    detail::aligned(p);
    detail::ldm_ok<float>(ldm);
    int lane = terse_shim::lane_id();
    for (int e = 0; e < M * N; e++) {
        // Element e is written by lane (5e + 1) mod 32: not the lane a kernel's own loop over
        // `e = lane; e += 32` would give it, so a missing __syncwarp after a store is a race.
        if ((e * 5 + 1) % 32 != lane) continue;
        int r = e / N, c = e % N;
        float v = f.at(r, c);
        if (layout == mem_row_major)
            p[r * ldm + c] = v;
        else
            p[c * ldm + r] = v;
    }
}

// d = a b + c, accumulated in f32.
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float, void>& d,
                     const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b,
                     const fragment<accumulator, M, N, K, float, void>& c) {
    fragment<accumulator, M, N, K, float, void> out;
    for (int r = 0; r < M; r++)
        for (int n = 0; n < N; n++) {
            float s = c.at(r, n);
            for (int k = 0; k < K; k++) s += detail::to_float(a.at(r, k)) * detail::to_float(b.at(k, n));
            out.at(r, n) = s;
        }
    d = out;
}
}  // namespace wmma
}  // namespace nvcuda
