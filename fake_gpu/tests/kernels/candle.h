// kernels_test.cpp's checks of candle's kernels (included by it alone), each launched as
// candle-core and candle-nn launch it, against a CPU reference.
#pragma once

#include "harness.h"

namespace {

// ---- candle's kernels, launched as candle-core and candle-nn launch them.
void candle_affine() {
    size_t n = 1000, dims = 1;
    const size_t* info = nullptr;
    auto x = ramp(n, 3.f);
    std::vector<float> out(n);
    const float* xp = x.data();
    float* op = out.data();
    float mul = 1.5f, add = -0.25f;
    ok("affine_f32", {1, 1, 1}, {1024, 1, 1},
       {P(n), P(dims), P(info), P(xp), P(op), P(mul), P(add)});
    for (size_t i = 0; i < n; i++) check(out[i] == x[i] * mul + add, "affine_f32 contiguous");
    // Strided: the transpose of a (10, 100) matrix.
    size_t nd = 2;
    std::vector<size_t> layout = {100, 10, 1, 100};
    const size_t* lp = layout.data();
    ok("affine_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(nd), P(lp), P(xp), P(op), P(mul), P(add)});
    for (size_t i = 0; i < n; i++)
        check(out[i] == x[(i % 10) * 100 + i / 10] * mul + add, "affine_f32 strided");
}

void candle_binary() {
    // lhs (4, 64) contiguous times rhs (64) broadcast over the rows.
    size_t rows = 4, cols = 64, n = rows * cols, nd = 2;
    std::vector<uint16_t> l(n), r(cols), out(n);
    auto lv = ramp(n, 2.f), rv = ramp(cols, 3.f, 0.5f);
    for (size_t i = 0; i < n; i++) l[i] = bf16_of(lv[i]);
    for (size_t i = 0; i < cols; i++) r[i] = bf16_of(rv[i]);
    std::vector<size_t> ds = {rows, cols, cols, 1, 0, 1};
    const size_t* dp = ds.data();
    const uint16_t *lp = l.data(), *rp = r.data();
    uint16_t* op = out.data();
    ok("bmul_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(nd), P(dp), P(lp), P(rp), P(op)});
    for (size_t i = 0; i < n; i++)
        check(out[i] == bf16_of((double)bf16_value(l[i]) * bf16_value(r[i % cols])),
              "bmul_bf16 broadcast element " + std::to_string(i));
    // Contiguous and 16-byte aligned: the float4 path, with a tail.
    size_t m = 1003;
    std::vector<uint16_t> a(m + 8), b(m + 8), c(m + 8);
    auto av = ramp(m, 5.f), bv = ramp(m, 0.7f, 0.1f);
    for (size_t i = 0; i < m; i++) {
        a[i] = bf16_of(av[i]);
        b[i] = bf16_of(bv[i]);
    }
    const size_t* none = nullptr;
    const uint16_t *ap = a.data(), *bp = b.data();
    uint16_t* cp = c.data();
    check((uintptr_t)ap % 16 == 0 && (uintptr_t)cp % 16 == 0, "aligned buffers");
    size_t one = 1;
    ok("badd_bf16", {1, 1, 1}, {1024, 1, 1}, {P(m), P(one), P(none), P(ap), P(bp), P(cp)});
    for (size_t i = 0; i < m; i++)
        check(c[i] == bf16_of((double)bf16_value(a[i]) + bf16_value(b[i])), "badd_bf16 contiguous");
}

void candle_cast() {
    // Ties (to even, both ways), the largest finite, overflow, NaN, subnormals, signs.
    std::vector<float> x = {1.0f, 1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f,
                            3.4e38f, NAN, -INFINITY, 1e-40f, -0.0f, 0.1f, 123.456f};
    std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0xbf80, 0x7f7f, 0x7f80,
                                  0x7fff, 0xff80, bf16_of((double)1e-40f), 0x8000, 0x3dcd, 0x42f7};
    size_t n = x.size(), dims = 1;
    const size_t* info = nullptr;
    std::vector<uint16_t> b(n);
    std::vector<float> back(n);
    const float* xp = x.data();
    uint16_t* bp = b.data();
    ok("cast_f32_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(xp), P(bp)});
    for (size_t i = 0; i < n; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f32_bf16(%g) = %04x, want %04x", x[i], b[i], want[i]);
        check(b[i] == want[i], msg);
    }
    const uint16_t* cb = b.data();
    float* backp = back.data();
    ok("cast_bf16_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(cb), P(backp)});
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        std::memcpy(&u, &back[i], 4);
        check(u == (uint32_t)b[i] << 16, "cast_bf16_f32 is exact");
    }
}

void candle_cast_16_and_8() {
    // f64 to f16 rounds once, from the double (1 + 2^-11 + 2^-40 is above the tie a rounding
    // through f32 would make), to nearest even, overflowing to inf, underflowing to subnormals.
    std::vector<double> x = {1.0, 1.0 + std::ldexp(1.0, -11), 1.0 + 3 * std::ldexp(1.0, -11),
                             1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 65504.0, 65520.0,
                             1e-8, 3e-8, NAN, -2.0};
    std::vector<uint16_t> want = {0x3c00, 0x3c00, 0x3c02, 0x3c01, 0x7bff,
                                  0x7c00, 0x0000, 0x0001, 0x7fff, 0xc000};
    size_t n = x.size(), dims = 1;
    const size_t* info = nullptr;
    std::vector<uint16_t> h(n);
    const double* xp = x.data();
    uint16_t* hp = h.data();
    ok("cast_f64_f16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(xp), P(hp)});
    for (size_t i = 0; i < n; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f64_f16(%.17g) = %04x, want %04x", x[i], h[i],
                      want[i]);
        check(h[i] == want[i], msg);
    }
    // f32 to fp8 e4m3: saturating to 448, ties to even, subnormals down to 2^-9; and back.
    std::vector<float> f = {1.0f, 448.f, 500.f, 1e6f, -1e6f, NAN, 1.0625f, 1.1875f,
                            std::ldexp(1.f, -9), std::ldexp(1.f, -10), 3 * std::ldexp(1.f, -10)};
    std::vector<uint8_t> want8 = {0x38, 0x7e, 0x7e, 0x7e, 0xfe, 0x7f, 0x38, 0x3a, 0x01, 0x00, 0x02};
    size_t m = f.size();
    std::vector<uint8_t> e(m);
    std::vector<float> back(m);
    const float* fp = f.data();
    uint8_t* ep = e.data();
    ok("cast_f32_f8_e4m3", {1, 1, 1}, {1024, 1, 1}, {P(m), P(dims), P(info), P(fp), P(ep)});
    for (size_t i = 0; i < m; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f32_f8_e4m3(%g) = %02x, want %02x", f[i], e[i],
                      want8[i]);
        check(e[i] == want8[i], msg);
    }
    const uint8_t* cep = e.data();
    float* bp = back.data();
    ok("cast_f8_e4m3_f32", {1, 1, 1}, {1024, 1, 1}, {P(m), P(dims), P(info), P(cep), P(bp)});
    check(back[0] == 1.f && back[1] == 448.f && back[4] == -448.f && std::isnan(back[5]) &&
              back[8] == std::ldexp(1.f, -9) && back[10] == std::ldexp(1.f, -8),
          "cast_f8_e4m3_f32");
}

void candle_fill_and_index() {
    size_t n = 777;
    std::vector<float> buf(n, 0.f);
    float* bp = buf.data();
    float v = 2.5f;
    ok("fill_f32", {1, 1, 1}, {1024, 1, 1}, {P(bp), P(v), P(n)});
    for (float f : buf) check(f == 2.5f, "fill_f32");
    // index_select over dim 1 of a (2, 5, 3) tensor with ids [4, 0, 2, 2].
    size_t left = 2, src_dim = 5, right = 3, ids_dim = 4, numel = left * ids_dim * right, nd = 3;
    auto src = ramp(left * src_dim * right, 10.f);
    std::vector<uint32_t> ids = {4, 0, 2, 2};
    std::vector<size_t> info = {2, 5, 3, 15, 3, 1};
    std::vector<float> out(numel);
    const size_t* ip = info.data();
    const uint32_t* idp = ids.data();
    const float* sp = src.data();
    float* op = out.data();
    ok("is_u32_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(nd), P(ip), P(idp), P(sp), P(op), P(left), P(src_dim), P(ids_dim), P(right)});
    for (size_t l = 0; l < left; l++)
        for (size_t j = 0; j < ids_dim; j++)
            for (size_t r = 0; r < right; r++)
                check(out[(l * ids_dim + j) * right + r] == src[(l * src_dim + ids[j]) * right + r],
                      "is_u32_f32");
    // gather along dim 1: ids of the output's shape (2, 4, 3).
    std::vector<uint32_t> gids(numel);
    for (size_t i = 0; i < numel; i++) gids[i] = (uint32_t)((i * 7) % src_dim);
    const uint32_t* gp = gids.data();
    ok("gather_u32_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(gp), P(sp), P(op), P(left), P(src_dim), P(ids_dim), P(right)});
    for (size_t i = 0; i < numel; i++) {
        size_t pre = i / (right * ids_dim), post = i % right;
        check(out[i] == src[(pre * src_dim + gids[i]) * right + post], "gather_u32_f32");
    }
}

void candle_softmax_rmsnorm() {
    // softmax-last-dim: a block of (1, 32, 1) per row (candle-nn ops.rs).
    int rows = 3, cols = 100;
    auto x = ramp((size_t)(rows * cols), 4.f);
    std::vector<float> y(x.size());
    const float* xp = x.data();
    float* yp = y.data();
    ok("softmax_f32", {(unsigned)rows, 1, 1}, {1, 32, 1}, {P(xp), P(yp), P(cols)});
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; r++) {
        double m = -1e300, s = 0;
        for (int c = 0; c < cols; c++) m = std::max(m, (double)x[r * cols + c]);
        for (int c = 0; c < cols; c++) s += std::exp((double)x[r * cols + c] - m);
        for (int c = 0; c < cols; c++)
            want[r * cols + c] = std::exp((double)x[r * cols + c] - m) / s;
    }
    close(y, want, 1e-6, "softmax_f32");
    // rmsnorm: a block of 32 threads per row below 1024 columns, 1024 from there.
    for (int n_cols : {64, 2048}) {
        int n_rows = 4, block_size = n_cols < 1024 ? 32 : 1024;
        float eps = 1e-6f;
        auto a = ramp((size_t)(n_rows * n_cols), 2.f);
        auto alpha = ramp((size_t)n_cols, 0.5f, 1.f);
        std::vector<float> dst(a.size());
        const float *ap = a.data(), *alp = alpha.data();
        float* dp = dst.data();
        ok("rmsnorm_f32", {(unsigned)n_rows, 1, 1}, {(unsigned)block_size, 1, 1},
           {P(ap), P(dp), P(alp), P(n_cols), P(block_size), P(eps)});
        std::vector<double> w(a.size());
        for (int r = 0; r < n_rows; r++) {
            double ss = 0;
            for (int c = 0; c < n_cols; c++) ss += (double)a[r * n_cols + c] * a[r * n_cols + c];
            double scale = 1.0 / std::sqrt(ss / n_cols + eps);
            for (int c = 0; c < n_cols; c++)
                w[r * n_cols + c] = scale * a[r * n_cols + c] * alpha[c];
        }
        close(dst, w, 1e-5, "rmsnorm_f32 cols " + std::to_string(n_cols));
    }
}

void candle_reductions() {
    // Sum over the last dim of (3, 1000): a block of 1024 per output (FastReduce).
    size_t rows = 3, cols = 1000, numel = rows * cols, per = cols, nd = 2;
    auto x = ramp(numel, 1.f, 0.25f);
    std::vector<size_t> info = {rows, cols, cols, 1};
    std::vector<float> s(rows);
    const size_t* ip = info.data();
    const float* xp = x.data();
    float* sp = s.data();
    ok("fast_sum_f32", {(unsigned)rows, 1, 1}, {1024, 1, 1},
       {P(numel), P(per), P(nd), P(ip), P(xp), P(sp)});
    std::vector<double> want(rows, 0.0);
    for (size_t i = 0; i < numel; i++) want[i / cols] += x[i];
    close(s, want, 1e-5, "fast_sum_f32");
    // Argmax over 50 columns: a block of 64.
    size_t c2 = 50, n2 = rows * c2;
    std::vector<size_t> info2 = {rows, c2, c2, 1};
    std::vector<uint32_t> arg(rows);
    const size_t* ip2 = info2.data();
    uint32_t* ap = arg.data();
    ok("fast_argmax_f32", {(unsigned)rows, 1, 1}, {64, 1, 1},
       {P(n2), P(c2), P(nd), P(ip2), P(xp), P(ap)});
    for (size_t r = 0; r < rows; r++) {
        size_t best = 0;
        for (size_t c = 1; c < c2; c++)
            if (x[r * c2 + c] > x[r * c2 + best]) best = c;
        check(arg[r] == best, "fast_argmax_f32 row " + std::to_string(r));
    }
    // Max of bf16 over 50 columns.
    std::vector<uint16_t> xb(n2), mb(rows);
    for (size_t i = 0; i < n2; i++) xb[i] = bf16_of(x[i]);
    const uint16_t* xbp = xb.data();
    uint16_t* mbp = mb.data();
    ok("fast_max_bf16", {(unsigned)rows, 1, 1}, {64, 1, 1},
       {P(n2), P(c2), P(nd), P(ip2), P(xbp), P(mbp)});
    for (size_t r = 0; r < rows; r++) {
        float m = -INFINITY;
        for (size_t c = 0; c < c2; c++) m = std::max(m, bf16_value(xb[r * c2 + c]));
        check(bf16_value(mb[r]) == m, "fast_max_bf16");
    }
}

void candle_where_and_unary() {
    // where over (3, 4): the condition broadcast over rows, f read transposed.
    size_t numel = 12, nd = 2;
    std::vector<uint8_t> ids = {1, 0, 0, 1};
    auto t = ramp(12, 1.f), f = ramp(12, 1.f, 5.f);
    std::vector<size_t> info = {3, 4, 0, 1, 4, 1, 1, 3};
    std::vector<float> out(numel);
    const size_t* ip = info.data();
    const uint8_t* idp = ids.data();
    const float *tp = t.data(), *fp = f.data();
    float* op = out.data();
    ok("where_u8_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(nd), P(ip), P(idp), P(tp), P(fp), P(op)});
    for (size_t i = 0; i < numel; i++) {
        size_t r = i / 4, c = i % 4;
        check(out[i] == (ids[c] ? t[r * 4 + c] : f[r + c * 3]), "where_u8_f32");
    }
    // uexp_bf16: within one bf16 ulp of the exact exponential (the device's ex2.approx too).
    size_t n = 500, dims = 1;
    const size_t* none = nullptr;
    auto xv = ramp(n, 6.f);
    std::vector<uint16_t> xb(n), yb(n);
    for (size_t i = 0; i < n; i++) xb[i] = bf16_of(xv[i]);
    const uint16_t* xbp = xb.data();
    uint16_t* ybp = yb.data();
    ok("uexp_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(none), P(xbp), P(ybp)});
    for (size_t i = 0; i < n; i++)
        check(ulps(yb[i], bf16_of(std::exp((double)bf16_value(xb[i])))) <= 1, "uexp_bf16");
    // usilu_f32.
    std::vector<float> ys(n);
    const float* xfp = xv.data();
    float* ysp = ys.data();
    ok("usilu_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(none), P(xfp), P(ysp)});
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++) want[i] = xv[i] / (1.0 + std::exp(-(double)xv[i]));
    close(ys, want, 1e-6, "usilu_f32");
}

void candle_sort_and_quantized() {
    // asort: a block per row, the padded row's indices in dynamic shared memory (candle-core
    // sort.rs), here 300 columns padded to 512.
    int nrows = 2, ncols = 300, pad = 512;
    auto x = ramp((size_t)(nrows * ncols), 9.f);
    std::vector<uint32_t> dst((size_t)(nrows * ncols));
    const float* xp = x.data();
    uint32_t* dp = dst.data();
    ok("asort_asc_f32", {(unsigned)nrows, 1, 1}, {(unsigned)pad, 1, 1},
       {P(xp), P(dp), P(ncols), P(pad)},
       pad * sizeof(int));
    for (int r = 0; r < nrows; r++) {
        std::vector<bool> seen(ncols, false);
        for (int c = 0; c < ncols; c++) {
            uint32_t i = dst[r * ncols + c];
            check(i < (uint32_t)ncols && !seen[i], "asort_asc_f32 is a permutation");
            seen[i] = true;
            if (c > 0)
                check(x[r * ncols + dst[r * ncols + c - 1]] <= x[r * ncols + i],
                      "asort_asc_f32 order");
        }
    }
    // dequantize q8_0: blocks of (f16 scale, 32 int8), 32 threads per 256 values.
    int elems = 512, nb32 = elems / 32;
    std::vector<uint8_t> q((size_t)nb32 * 34);
    const uint16_t scales[4] = {0x3400, 0x3800, 0x3a00, 0x3c00};  // 0.25, 0.5, 0.75, 1
    std::vector<double> want((size_t)elems);
    for (int b = 0; b < nb32; b++) {
        std::memcpy(&q[(size_t)b * 34], &scales[b % 4], 2);
        for (int j = 0; j < 32; j++) {
            int8_t v = (int8_t)((b * 37 + j * 11) % 255 - 127);
            q[(size_t)b * 34 + 2 + j] = (uint8_t)v;
            want[(size_t)(b * 32 + j)] = 0.25 * (b % 4 + 1) * v;
        }
    }
    std::vector<float> y((size_t)elems);
    const void* qp = q.data();
    float* yp = y.data();
    ok("dequantize_block_q8_0_f32", {(unsigned)((elems + 255) / 256), 1, 1}, {32, 1, 1},
       {P(qp), P(yp), P(nb32)});
    close(y, want, 0.0, "dequantize_block_q8_0_f32");
}

}  // namespace
