// Exact sampling on the device, one block of TERSE_SAMPLE_BLOCK threads per row of logits
// (n, V) f32: temperature, then top-k, top-p and min-p in HF's warper order, then inverse CDF
// with the row's own uniform. The uniform is the host's, drawn from the sample's stream and
// uploaded as f64 bits (8 bytes a row), so a sample's draws never depend on the batch. Out: 16
// bytes a row, so no (B, V) tensor leaves the device. CPU reference (the CPU sampler itself):
// terse_model::kernels::sample::reference::sample_row.
//
// The semantics are the reference's: x = logit / T and q_i = exp(x_i - log Z) in f64; without
// truncation the inverse CDF walks the ids in order; with truncation the kept set is a prefix
// of the order (logit descending, id ascending) and the inverse CDF walks that order. A prefix
// is (key K, j): every logit whose key is above K and the j lowest ids whose key is K. Prefixes
// are found without a sort, by a radix descent over the logits' keys, 4 bits a level, each
// bin's count and mass summed in a fixed order (a thread's strided elements in order, then a
// fixed tree through shared memory), so runs are bit-identical. The sums' association differs
// from the reference's sequential sums, so the token can differ only where a draw or a top-p
// mass lies within rounding of a boundary, or at exactly tied logits (the reference's order
// there is by probability, which equal logits share): the tests count these.
//
// Out (n, 4) u32: the token, then the bits of three f32s: log p under the truncated and
// renormalised distribution, log p under the plain temperature softmax, and that softmax's
// entropy.
#include "common.cuh"
#include <string.h>

#define BLOCK TERSE_SAMPLE_BLOCK

// The helpers' names are this file's own (the shim links every kernels/ file into one library).
namespace sampling {

// The radix descent's bins: 4 bits of a key a level (not a launch constant: any block size that
// is a multiple of BINS x BINS sums them).
constexpr int BINS = 16;

// The order of logits as unsigned keys: a larger float has a larger key (-0 counts as +0).
__device__ __forceinline__ uint32_t key_of(float x) {
    if (x == 0.f) x = 0.f;
    uint32_t b;
    memcpy(&b, &x, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float logit_of(uint32_t k) {
    uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float x;
    memcpy(&x, &b, 4);
    return x;
}

__device__ __forceinline__ double f64_of(size_t bits) {
    uint64_t b = bits;
    double x;
    memcpy(&x, &b, 8);
    return x;
}

__device__ __forceinline__ uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

// A prefix of the order (logit descending, id ascending): keys above `key`, and the `j` lowest
// ids whose key is `key`.
struct Prefix {
    uint32_t key, j;
};

// What every pass over a row needs.
struct Row {
    const float* lg;
    int v;
    double t, log_z;
    __device__ double q(float logit) const { return exp((double)logit / t - log_z); }
};

// Shared scratch of the block: the bins' per-thread partials, then the partials' partials.
struct Scratch {
    double part[BINS][BLOCK];
    double part2[BINS][BLOCK / BINS];
    double out[BINS];
    double total;
};

// Sums `v` over the block in a fixed order; every thread gets the same bits.
__device__ double block_sum(Scratch& s, double v) {
    __syncthreads();
    s.part[0][threadIdx.x] = v;
    __syncthreads();
    double r = 0;
    for (int i = 0; i < BLOCK; i++) r += s.part[0][i];
    __syncthreads();
    return r;
}

__device__ double block_max(Scratch& s, double v) {
    __syncthreads();
    s.part[0][threadIdx.x] = v;
    __syncthreads();
    double r = s.part[0][0];
    for (int i = 1; i < BLOCK; i++) r = fmax(r, s.part[0][i]);
    __syncthreads();
    return r;
}

// Reduces each thread's BINS values to their block sums in `s.out`: a fixed tree (BINS groups of
// BLOCK / BINS threads, then one thread a bin), so the result has the same bits every run.
__device__ __forceinline__ void bins_sum(Scratch& s, const double* mine) {
    __syncthreads();
#pragma unroll
    for (int b = 0; b < BINS; b++) s.part[b][threadIdx.x] = mine[b];
    __syncthreads();
    {
        int b = threadIdx.x / (BLOCK / BINS), g = threadIdx.x % (BLOCK / BINS);
        double r = 0;
        for (int i = 0; i < BINS; i++) r += s.part[b][g * BINS + i];
        s.part2[b][g] = r;
    }
    __syncthreads();
    if (threadIdx.x < BINS) {
        double r = 0;
        for (int g = 0; g < BLOCK / BINS; g++) r += s.part2[threadIdx.x][g];
        s.out[threadIdx.x] = r;
    }
    __syncthreads();
}

// The mass of a prefix: the keys above it element by element, its tied ids as j copies.
__device__ double mass_of(Scratch& s, const Row& r, Prefix p) {
    double m = 0;
    for (int i = threadIdx.x; i < r.v; i += BLOCK) {
        if (key_of(r.lg[i]) > p.key) m += r.q(r.lg[i]);
    }
    return block_sum(s, m) + (double)p.j * r.q(logit_of(p.key));
}

// The sum of the values of the threads before this one (each thread's value is over its
// contiguous chunk of ids), in thread order by one thread: a fixed order; `total` gets the sum
// over every thread.
__device__ double chunk_before(Scratch& s, double c, double* total) {
    __syncthreads();
    s.part[0][threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        double before = 0;
        for (int i = 0; i < BLOCK; i++) {
            double ci = s.part[0][i];
            s.part[1][i] = before;
            before += ci;
        }
        s.total = before;
    }
    __syncthreads();
    *total = s.total;
    return s.part[1][threadIdx.x];
}

// The id of the j-th (1-based) lowest id whose key is `key`: each thread counts a contiguous
// chunk of ids, the chunks' counts are scanned in order, and the thread holding it finds it.
__device__ int nth_id(Scratch& s, const Row& r, uint32_t key, uint32_t j) {
    int chunk = (r.v + BLOCK - 1) / BLOCK;
    int lo = threadIdx.x * chunk, hi = min(lo + chunk, r.v);
    double c = 0;
    for (int i = lo; i < hi; i++) c += key_of(r.lg[i]) == key ? 1.0 : 0.0;
    double all;
    double before = chunk_before(s, c, &all);
    if (threadIdx.x == 0) s.out[0] = (double)(r.v - 1);
    __syncthreads();
    if (before < (double)j && (double)j <= before + c) {
        double seen = before;
        for (int i = lo; i < hi; i++) {
            if (key_of(r.lg[i]) == key && ++seen == (double)j) {
                s.out[0] = (double)i;
                break;
            }
        }
    }
    __syncthreads();
    int id = (int)s.out[0];
    __syncthreads();
    return id;
}

// The shortest prefix within `bound` whose count (by_count) or mass reaches `target`: at least
// `target`, or above it when `strict` (the inverse CDF's u < cum). A radix descent over the keys
// from the top 4 bits down; `found` is false when even the whole bound falls short (a draw at
// the rounding edge), and the bound is returned, as the reference falls back to its last element.
__device__ Prefix descend(Scratch& s, const Row& r, Prefix bound, double target, bool by_count,
                          bool strict, bool* found) {
    uint32_t hi = 0;
    double above = 0;
    double tied_q = r.q(logit_of(bound.key));
    double mass[BINS], count[BINS];
    double last = 0;
    for (int level = 0; level < 8; level++) {
        int shift = 28 - 4 * level;
#pragma unroll
        for (int b = 0; b < BINS; b++) mass[b] = count[b] = 0;
        for (int i = threadIdx.x; i < r.v; i += BLOCK) {
            uint32_t k = key_of(r.lg[i]);
            if (k <= bound.key || (level > 0 && (k >> (shift + 4)) != (hi >> (shift + 4)))) continue;
            uint32_t d = (k >> shift) & (BINS - 1);
            double q = by_count ? 0.0 : r.q(r.lg[i]);
#pragma unroll
            for (int b = 0; b < BINS; b++) {
                mass[b] += d == (uint32_t)b ? q : 0.0;
                count[b] += d == (uint32_t)b ? 1.0 : 0.0;
            }
        }
        // The bins' block sums, over the per-thread arrays in place; the bound's tied ids as
        // j copies in their bin.
        bins_sum(s, mass);
#pragma unroll
        for (int b = 0; b < BINS; b++) mass[b] = s.out[b];
        bins_sum(s, count);
#pragma unroll
        for (int b = 0; b < BINS; b++) count[b] = s.out[b];
        bool tied_here = level == 0 || (bound.key >> (shift + 4)) == (hi >> (shift + 4));
        uint32_t td = (bound.key >> shift) & (BINS - 1);
        int chosen = -1;
#pragma unroll
        for (int b = BINS - 1; b >= 0; b--) {
            double bm = mass[b], bc = count[b];
            if (tied_here && td == (uint32_t)b) {
                bm += (double)bound.j * tied_q;
                bc += (double)bound.j;
            }
            double val = by_count ? bc : bm;
            bool reach = strict ? target < above + val : target <= above + val;
            if (chosen < 0) {
                if (bc > 0 && reach) {
                    chosen = b;
                    last = bc;
                } else {
                    above += val;
                }
            }
        }
        if (chosen < 0) {
            *found = false;
            return bound;
        }
        hi |= (uint32_t)chosen << shift;
    }
    *found = true;
    uint32_t j;
    if (by_count) {
        j = (uint32_t)(target - above);
    } else {
        double q = r.q(logit_of(hi));
        j = 1;
        if (q > 0) {
            double need = ceil((target - above) / q);
            j = need < 1 ? 1 : need > last ? (uint32_t)last : (uint32_t)need;
        }
        auto reach = [&](uint32_t n) {
            double cum = above + (double)n * q;
            return strict ? target < cum : target <= cum;
        };
        while (j > 1 && reach(j - 1)) j--;
        while (j < (uint32_t)last && !reach(j)) j++;
    }
    return Prefix{hi, j};
}

}  // namespace sampling

using namespace sampling;

// logits (n, V) f32; uniforms (n, 2) u32, each row's f64 uniform in [0, 1) as (low, high) bits;
// the settings' f64 values as bits (temperature 0 = greedy; top_k 0 = off, top_p 1 = off,
// min_p 0 = off) -> out (n, 4) u32.
extern "C" __global__ void sample_f32(const float* logits, const uint32_t* uniforms,
                                      uint32_t* out, int v, int top_k, size_t temperature,
                                      size_t top_p, size_t min_p) {
    __shared__ Scratch s;
    const float* x = logits + (size_t)blockIdx.x * v;
    double temp = f64_of(temperature), tp = f64_of(top_p), mp = f64_of(min_p);
    double t = temp > 0 ? temp : 1.0;
    uint64_t ubits = (uint64_t)uniforms[2 * blockIdx.x] |
                     ((uint64_t)uniforms[2 * blockIdx.x + 1] << 32);
    double u;
    memcpy(&u, &ubits, 8);

    // The plain softmax: max, log-partition, entropy; the largest and smallest keys.
    double m = -INFINITY, kmax = 0, kmin = 4294967295.0;
    for (int i = threadIdx.x; i < v; i += BLOCK) {
        m = fmax(m, (double)x[i] / t);
        double k = key_of(x[i]);
        kmax = fmax(kmax, k);
        kmin = fmin(kmin, k);
    }
    m = block_max(s, m);
    kmax = block_max(s, kmax);
    kmin = -block_max(s, -kmin);
    double z = 0, zx = 0;
    for (int i = threadIdx.x; i < v; i += BLOCK) {
        double xi = (double)x[i] / t, e = exp(xi - m);
        z += e;
        zx += e > 0 ? e * xi : 0.0;
    }
    z = block_sum(s, z);
    zx = block_sum(s, zx);
    Row r{x, v, t, m + log(z)};
    double entropy = r.log_z - zx / z;

    int token;
    double logp;
    bool truncating = (top_k > 0 && top_k < v) || tp < 1.0 || mp > 0.0;
    if (temp == 0.0) {
        // Greedy: the first maximal id.
        token = nth_id(s, r, (uint32_t)kmax, 1);
        logp = 0.0;
    } else if (!truncating) {
        // Inverse CDF over the ids in order: a chunk per thread, the chunks' masses scanned
        // (their sum in order is the total).
        int chunk = (v + BLOCK - 1) / BLOCK;
        int lo = threadIdx.x * chunk, hi = min(lo + chunk, v);
        double c = 0;
        for (int i = lo; i < hi; i++) c += r.q(x[i]);
        double total;
        double cum = chunk_before(s, c, &total);
        double target = u * total;
        double first = (double)v;
        for (int i = lo; i < hi; i++) {
            cum += r.q(x[i]);
            if (target < cum) {
                first = i;
                break;
            }
        }
        first = -block_max(s, -first);
        token = first < (double)v ? (int)first : v - 1;
        logp = log(r.q(x[token]) / total);
    } else {
        // The kept set as a prefix of the order, one warper at a time.
        double ties = 0;
        for (int i = threadIdx.x; i < v; i += BLOCK) ties += key_of(x[i]) == (uint32_t)kmin;
        Prefix kept{(uint32_t)kmin, (uint32_t)block_sum(s, ties)};
        bool found;
        if (top_k > 0 && top_k < v) kept = descend(s, r, kept, (double)top_k, true, false, &found);
        if (tp < 1.0) {
            double total = mass_of(s, r, kept);
            kept = descend(s, r, kept, tp * total, false, false, &found);
        }
        if (mp > 0.0) {
            // Keep q / total >= min_p * q_max / total: a prefix, since q grows with the key.
            double total = mass_of(s, r, kept);
            double cut = mp * r.q(logit_of((uint32_t)kmax)) / total;
            double low = kmax;
            for (int i = threadIdx.x; i < v; i += BLOCK) {
                uint32_t k = key_of(x[i]);
                if (k >= kept.key && r.q(x[i]) / total >= cut) low = fmin(low, (double)k);
            }
            low = -block_max(s, -low);
            if ((uint32_t)low > kept.key) {
                double n = 0;
                for (int i = threadIdx.x; i < v; i += BLOCK) n += key_of(x[i]) == (uint32_t)low;
                kept = Prefix{(uint32_t)low, (uint32_t)block_sum(s, n)};
            }
        }
        double total = mass_of(s, r, kept);
        Prefix pick = descend(s, r, kept, u * total, false, true, &found);
        token = nth_id(s, r, pick.key, pick.j);
        logp = log(r.q(logit_of(pick.key)) / total);
    }
    if (threadIdx.x == 0) {
        uint32_t* o = out + 4 * (size_t)blockIdx.x;
        o[0] = (uint32_t)token;
        o[1] = bits_of((float)logp);
        o[2] = bits_of((float)((double)x[token] / t - r.log_z));
        o[3] = bits_of((float)entropy);
    }
}
