// AdamW over every parameter in one launch (crates/model/src/kernels/adamw.rs describes it and
// holds its CPU reference; crates/optim's `AdamW::step` calls it on CUDA unless TERSE_FUSED=0).
//
// The table has one row of ADAMW_ROW u64 per tensor (crates/model/src/kernels/adamw.rs's
// `adamw_table`): the parameter (T), its f32 master (0 when T is f32: the parameter is its own
// master), exp_avg, exp_avg_sq (f32), the gradient (T), the element count, the tensor's first
// block, and an unused word. `scal` holds two f32 per tensor: the step size
// lr / (1 - beta1^step) and 1 / sqrt(1 - beta2^step), as candle rounds them to f32.
// Block b updates TERSE_ADAMW_CHUNK elements of the last tensor whose first block is <= b.
//
// Bit-identical to the per-tensor update of candle ops (crates/optim/src/adamw.rs): each step
// below is one of those ops, rounded on its own. __fmul_rn / __fadd_rn keep nvcc from
// contracting a product and a sum into one fma; candle's affine x * mul + add is one fma on the
// device, which equals the rounded product where add is 0 and the rounded sum where mul is 1,
// the only two forms the update uses.
#include "common.cuh"

#define ADAMW_ROW 8

// The table row of this block's tensor: a binary search over the rows' first blocks.
__device__ int row_of_block(const uint64_t* table, int tensors, uint64_t b) {
    int lo = 0, hi = tensors - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (table[ADAMW_ROW * mid + 6] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

template <typename T>
__device__ void adamw_multi(const uint64_t* table, const float* scal, int tensors, float decay,
                            float b1c, float beta2, float b2c, float eps) {
    const uint64_t b = blockIdx.x;
    const int lo = row_of_block(table, tensors, b);
    const uint64_t* row = table + ADAMW_ROW * lo;
    T* param = reinterpret_cast<T*>(row[0]);
    float* master = reinterpret_cast<float*>(row[1]);
    float* m = reinterpret_cast<float*>(row[2]);
    float* v = reinterpret_cast<float*>(row[3]);
    const T* grad = reinterpret_cast<const T*>(row[4]);
    const uint64_t len = row[5];
    const float step_size = scal[2 * lo], inv_bc2 = scal[2 * lo + 1];
    const uint64_t start = (b - row[6]) * TERSE_ADAMW_CHUNK;
    const uint64_t end = start + TERSE_ADAMW_CHUNK < len ? start + TERSE_ADAMW_CHUNK : len;
    for (uint64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        float g = to_f(grad[i]);
        float w = master ? master[i] : to_f(param[i]);
        w = __fmul_rn(w, decay);                                      // master * (1 - lr wd)
        float mi = __fadd_rn(m[i], __fmul_rn(g - m[i], b1c));        // m + (g - m)(1 - b1)
        float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(g, g), b2c));
        float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), inv_bc2), eps);  // sqrt(v)/bc2 + eps
        w = w - __fmul_rn(__fdiv_rn(mi, den), step_size);            // - m / den * lr/bc1
        m[i] = mi;
        v[i] = vi;
        if (master) master[i] = w;
        param[i] = from_f<T>(w);
    }
}

#define ADAMW_ENTRY(NAME, T)                                                                  \
    extern "C" __global__ void NAME(const uint64_t* table, const float* scal, int tensors,    \
                                    float decay, float b1c, float beta2, float b2c, float eps) { \
        adamw_multi<T>(table, scal, tensors, decay, b1c, beta2, b2c, eps);                    \
    }

ADAMW_ENTRY(adamw_f32, float)
ADAMW_ENTRY(adamw_bf16, __nv_bfloat16)

// Gradient clipping's sum of squares over every f32 gradient (crates/optim/src/clip.rs on
// CUDA), over the same table (the gradient in word 4): block b writes partial[b], the f64 sum
// of g * g over its chunk. Each product is exact in f64; thread t adds its elements t, t +
// blockDim, ... in order, then the block's threads are added in a fixed tree, so every run
// gives the same bits (the CPU reference repeats the order). The host adds the partials in
// block order.
extern "C" __global__ void grad_sumsq_f32(const uint64_t* table, int tensors, double* partial) {
    __shared__ double sh[TERSE_ADAMW_BLOCK];
    const uint64_t b = blockIdx.x;
    const uint64_t* row = table + ADAMW_ROW * row_of_block(table, tensors, b);
    const float* g = reinterpret_cast<const float*>(row[4]);
    const uint64_t len = row[5];
    const uint64_t start = (b - row[6]) * TERSE_ADAMW_CHUNK;
    const uint64_t end = start + TERSE_ADAMW_CHUNK < len ? start + TERSE_ADAMW_CHUNK : len;
    double s = 0.0;
    for (uint64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        const double v = g[i];
        s += v * v;  // exact product: an fma rounds the same sum
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[b] = sh[0];
}
