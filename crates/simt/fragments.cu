// Probes of kernels/mma.cuh for crates/simt's fragment tests (src/lib_tests/fragments.rs): one warp
// runs mma.sync on fragments the test packs per lane, ldmatrix (plain and .trans, x4 and x2) on
// a known tile, an mma whose operands come from shared memory through ldmatrix as the flash
// kernels load Q, K and V, cp.async reads before and after its waits, dynamic shared memory,
// and the faults the shim reports. Compiled only into the shim (build.rs), never for a GPU.
#include "../../kernels/mma.cuh"

// d = a b + c with every lane's registers given: a (32 x 4), b (32 x 2), c and d (32 x 4).
extern "C" __global__ void probe_mma(const uint32_t* a, const uint32_t* b, const float* c,
                                     float* d) {
    int lane = threadIdx.x % 32;
    uint32_t ra[4], rb[2];
    float rc[4], rd[4];
    for (int i = 0; i < 4; i++) ra[i] = a[lane * 4 + i], rc[i] = c[lane * 4 + i];
    for (int i = 0; i < 2; i++) rb[i] = b[lane * 2 + i];
    mma_bf16_16816(rd, ra, rb, rc);
    for (int i = 0; i < 4; i++) d[lane * 4 + i] = rd[i];
}

// A 16 x 16 tile of bf16 (one value per u32 of `tile`, row-major) in shared memory with a
// padded row of 24 elements; the four 8 x 8 quarters as matrices 0 (rows 0-7, columns 0-7),
// 1 (rows 8-15), 2 (columns 8-15), 3 (both). out: [x4, x4.trans, x2, x2.trans][lane][4].
extern "C" __global__ void probe_ldmatrix(const uint32_t* tile, uint32_t* out) {
    __shared__ __align__(16) uint16_t s[16 * 24];
    int lane = threadIdx.x % 32;
    for (int e = lane; e < 256; e += 32) s[(e / 16) * 24 + e % 16] = (uint16_t)tile[e];
    __syncwarp();
    int m = lane / 8, r = lane % 8;
    const uint16_t* row = &s[(r + 8 * (m & 1)) * 24 + 8 * (m >> 1)];
    // x2 reads matrices 0 and 1 from lanes 0-15; the rest repeat those addresses.
    int m2 = (lane % 16) / 8;
    const uint16_t* row2 = &s[(r + 8 * m2) * 24];
    uint32_t v[4][4] = {};
    ldmatrix_x4(v[0], row);
    ldmatrix_x4_trans(v[1], row);
    ldmatrix_x2(v[2], row2);
    ldmatrix_x2_trans(v[3], row2);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) out[(k * 32 + lane) * 4 + i] = v[k][i];
}

// D = A B (16 x 8, row-major f32 in d[0..128]) with A (16 x 16) and B given twice: as bt
// ([n][k], 8 x 16, read by ldmatrix as K is) and as bk ([k][n], 16 x 8, read by ldmatrix.trans
// as V is); the second product lands in d[128..256]. Inputs one bf16 per u32, row-major.
extern "C" __global__ void probe_mma_smem(const uint32_t* a, const uint32_t* bt,
                                          const uint32_t* bk, float* d) {
    __shared__ __align__(16) uint16_t sa[16 * 16], sbt[8 * 16], sbk[16 * 8];
    int lane = threadIdx.x % 32;
    for (int e = lane; e < 256; e += 32) sa[e] = (uint16_t)a[e];
    for (int e = lane; e < 128; e += 32) sbt[e] = (uint16_t)bt[e], sbk[e] = (uint16_t)bk[e];
    __syncwarp();
    uint32_t ra[4], rb[2], rv[2];
    ldmatrix_x4(ra, &sa[(lane % 8 + 8 * ((lane / 8) & 1)) * 16 + 8 * (lane / 16)]);
    int l = lane % 16;
    ldmatrix_x2(rb, &sbt[(l % 8) * 16 + 8 * (l / 8)]);
    ldmatrix_x2_trans(rv, &sbk[(l % 8 + 8 * (l / 8)) * 8]);
    float zero[4] = {0, 0, 0, 0}, out[2][4];
    mma_bf16_16816(out[0], ra, rb, zero);
    mma_bf16_16816(out[1], ra, rv, zero);
    // The C fragment's layout (kernels/mma.cuh): c[i] is row g + 8 (i / 2), column 2t + i % 2.
    int g = lane / 4, t = lane % 4;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) d[k * 128 + (g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = out[k][i];
}

// Two cp.async groups of 16 bytes per lane; out: [before any wait, after wait<1>, after
// wait<0>][lane][8], each lane reading back its own destination.
extern "C" __global__ void probe_cp_async(const uint32_t* src, uint32_t* out) {
    __shared__ __align__(16) uint32_t s[32 * 8];
    int lane = threadIdx.x % 32;
    cp_async16(&s[lane * 8], &src[lane * 8]);
    cp_async_commit();
    cp_async16(&s[lane * 8 + 4], &src[lane * 8 + 4]);
    cp_async_commit();
    for (int i = 0; i < 8; i++) out[lane * 8 + i] = s[lane * 8 + i];
    cp_async_wait<1>();
    for (int i = 0; i < 8; i++) out[256 + lane * 8 + i] = s[lane * 8 + i];
    cp_async_wait<0>();
    for (int i = 0; i < 8; i++) out[512 + lane * 8 + i] = s[lane * 8 + i];
}

// Dynamic shared memory: out[t] = x[blockDim - 1 - t] through it, and out[blockDim + t] the
// word after the block's part as it found it (the launch gives 2 blockDim floats).
extern "C" __global__ void probe_dynamic_shared(const float* x, float* out) {
    TERSE_DYNAMIC_SHARED(smem);
    float* s = reinterpret_cast<float*>(smem);
    unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = x[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * 2 * n + t] = s[n - 1 - t];
    out[blockIdx.x * 2 * n + n + t] = s[n + t];
}

// An ldmatrix whose lane 3 gives a row address 8 bytes past a 16-byte boundary.
extern "C" __global__ void fault_ldmatrix_misaligned(float* out) {
    __shared__ __align__(16) uint16_t s[32 * 8 + 8];
    int lane = threadIdx.x % 32;
    uint32_t r[4];
    ldmatrix_x4(r, &s[lane * 8 + (lane == 3 ? 4 : 0)]);
    out[threadIdx.x] = (float)r[0];
}

// A cp.async from a source 4 bytes past a 16-byte boundary.
extern "C" __global__ void fault_cp_async_misaligned(float* out) {
    __shared__ __align__(16) float s[4 * 64];
    cp_async16(&s[4 * threadIdx.x], out + 4 * threadIdx.x + 1);
    cp_async_commit();
    cp_async_wait<0>();
}
