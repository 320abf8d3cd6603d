// nccl_test.cpp's scenarios of working collectives (included by it alone): initialisation,
// all-reduce in every type and operation, scatter/gather, buffers many times the staging area.
// Each runs in every rank process.
#pragma once

#include "harness.h"

namespace {

// ---- Scenarios: each runs in every rank process.

void scenario_init(int nranks, const ncclUniqueId& id) {
    if (g_rank == nranks - 1) usleep(300000);  // the others wait for the last rank
    ncclComm_t comm = nullptr;
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, g_rank, &cfg);
    CHECK(r == ncclInProgress || r == ncclSuccess, "ncclCommInitRankConfig returned %s",
          ncclGetErrorString(r));
    if (!comm) return fail("no communicator");
    bool saw = false;
    ncclResult_t st = poll_async(comm, 20, &saw);
    CHECK(st == ncclSuccess, "initialisation ended with %s", ncclGetErrorString(st));
    if (g_rank < nranks - 1)
        CHECK(saw, "ncclCommGetAsyncError never said ncclInProgress while a rank was late");
    int count = 0, rank = -1;
    CHECK(ncclCommCount(comm, &count) == ncclSuccess && count == nranks, "ncclCommCount %d", count);
    CHECK(ncclCommUserRank(comm, &rank) == ncclSuccess && rank == g_rank, "ncclCommUserRank %d",
          rank);
    CHECK(!shm_exists(id), "the segment's name outlived the join");
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

template <class T>
std::vector<T> fold(const std::vector<std::vector<T>>& per_rank, T (*f)(T, T)) {
    std::vector<T> acc = per_rank[0];
    for (size_t k = 1; k < per_rank.size(); k++)
        for (size_t i = 0; i < acc.size(); i++) acc[i] = f(acc[i], per_rank[k][i]);
    return acc;
}

void scenario_allreduce(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    // f32: values where the order of the sum matters (1e8 + 1 - 1e8), over > 1 block of 1024.
    const size_t n = 3001;
    auto value = [](int r, size_t i) -> float {
        switch (i % 4) {
            case 0: return r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f;
            case 1: return 0.1f * (float)(r + 1) * (float)i;
            case 2: return (r % 2 ? -1.0f : 1.0f) * (float)(i % 17) / 3.0f;
            default: return (float)(r * 7 + 1) / 9.0f;
        }
    };
    std::vector<std::vector<float>> all(nranks, std::vector<float>(n));
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < n; i++) all[r][i] = value(r, i);
    struct OpCase {
        ncclRedOp_t op;
        const char* name;
        float (*f)(float, float);
        bool avg;
    };
    OpCase ops[] = {
        {ncclSum, "sum", [](float a, float b) { return a + b; }, false},
        {ncclProd, "prod", [](float a, float b) { return a * b; }, false},
        {ncclMax, "max", [](float a, float b) { return a < b ? b : a; }, false},
        {ncclMin, "min", [](float a, float b) { return b < a ? b : a; }, false},
        {ncclAvg, "avg", [](float a, float b) { return a + b; }, true},
    };
    for (const OpCase& c : ops) {
        std::vector<float> expect = fold(all, c.f);
        if (c.avg)
            for (float& v : expect) v /= (float)nranks;
        dvec<float> send = dev(all[g_rank]), recv(n, NAN);
        if (!ok(c.name, ncclAllReduce(send.data(), recv.data(), n, ncclFloat32, c.op, comm, nullptr),
                comm))
            break;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += fbits(recv[i]) != fbits(expect[i]);
        CHECK(bad == 0, "f32 %s: %zu of %zu values differ from the rank-order result (e.g. [0] %g)",
              c.name, bad, n, recv[0]);
        CHECK(std::equal(send.begin(), send.end(), all[g_rank].begin()),
              "f32 %s changed the send buffer", c.name);
        publish(recv.data(), n * 4);
    }
    // f32 in place.
    {
        dvec<float> buf = dev(all[g_rank]);
        std::vector<float> expect = fold(all, ops[0].f);
        if (ok("in-place sum",
               ncclAllReduce(buf.data(), buf.data(), n, ncclFloat32, ncclSum, comm, nullptr), comm))
            CHECK(std::memcmp(buf.data(), expect.data(), n * 4) == 0, "f32 in-place sum differs");
        publish(buf.data(), n * 4);
    }
    // bf16: summed in f32 and rounded once (stepwise rounding would give 1.0 for 1 + 2^-8 + 2^-8).
    if (nranks == 3) {
        const uint16_t one = 0x3f80, tiny = 0x3b80;  // 1.0, 2^-8
        uint16_t sum_in[3] = {one, tiny, tiny};
        uint16_t avg_in[3] = {0x3f80, 0x4000, 0x4080};  // 1, 2, 4
        uint16_t max_in[3] = {0xbf80, 0x4040, 0x4000};  // -1, 3, 2
        struct Case {
            const uint16_t* in;
            ncclRedOp_t op;
            uint16_t expect;
            const char* name;
        } cases[] = {{sum_in, ncclSum, 0x3f81, "sum"},  // 1 + 2^-7
                     {avg_in, ncclAvg, 0x4015, "avg"},  // 7/3 -> 2.328125
                     {max_in, ncclMax, 0x4040, "max"}};  // 3
        for (const Case& c : cases) {
            dvec<uint16_t> send(5, c.in[g_rank]), recv(5, 0xffff);
            if (!ok(c.name, ncclAllReduce(send.data(), recv.data(), 5, ncclBfloat16, c.op, comm,
                                          nullptr),
                    comm))
                break;
            for (int i = 0; i < 5; i++)
                CHECK(recv[i] == c.expect, "bf16 %s: 0x%04x, expected 0x%04x", c.name, recv[i],
                      c.expect);
            publish(recv.data(), 10);
        }
        // f16 likewise: 1 + 2^-11 + 2^-11 = 1 + 2^-10; avg(1, 2, 4); 3 x 2^-24; 60000 x 3 -> inf.
        uint16_t f16_sum[3] = {0x3c00, 0x1000, 0x1000};
        uint16_t f16_avg[3] = {0x3c00, 0x4000, 0x4400};
        uint16_t f16_sub[3] = {0x0001, 0x0001, 0x0001};
        uint16_t f16_inf[3] = {0x7b53, 0x7b53, 0x7b53};
        Case f16_cases[] = {{f16_sum, ncclSum, 0x3c01, "f16 sum"},
                            {f16_avg, ncclAvg, 0x40ab, "f16 avg"},
                            {f16_sub, ncclSum, 0x0003, "f16 subnormal sum"},
                            {f16_inf, ncclSum, 0x7c00, "f16 overflow"}};
        for (const Case& c : f16_cases) {
            Dev<uint16_t> send(c.in[g_rank]), recv(0xffff);
            if (!ok(c.name, ncclAllReduce(send.p, recv.p, 1, ncclFloat16, c.op, comm, nullptr), comm))
                break;
            CHECK(*recv == c.expect, "%s: 0x%04x, expected 0x%04x", c.name, *recv, c.expect);
        }
    }
    // bf16 over a pattern: the f32 rank-order sum, rounded once (the test's own rounding).
    {
        const size_t m = 2500;
        std::vector<std::vector<uint16_t>> in(nranks, std::vector<uint16_t>(m));
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < m; i++)
                in[r][i] = to_bf16((float)((i * 37 + r * 11) % 101) / 7.0f - 5.0f);
        dvec<uint16_t> send = dev(in[g_rank]), recv(m, 0);
        if (ok("bf16 pattern sum",
               ncclAllReduce(send.data(), recv.data(), m, ncclBfloat16, ncclSum, comm, nullptr),
               comm)) {
            size_t bad = 0;
            for (size_t i = 0; i < m; i++) {
                float acc = bf16f(in[0][i]);
                for (int r = 1; r < nranks; r++) acc += bf16f(in[r][i]);
                bad += recv[i] != to_bf16(acc);
            }
            CHECK(bad == 0, "bf16 pattern sum: %zu of %zu values wrong", bad, m);
        }
        publish(recv.data(), m * 2);
    }
    // f64, integers.
    {
        double d[3] = {0.1, 0.2, 0.3};
        Dev<double> send(d[g_rank % 3]), recv(0);
        double expect = d[0];
        for (int r = 1; r < nranks; r++) expect += d[r % 3];
        if (ok("f64 sum", ncclAllReduce(send.p, recv.p, 1, ncclFloat64, ncclSum, comm, nullptr), comm))
            CHECK(dbits(*recv) == dbits(expect), "f64 sum %.17g, expected %.17g", *recv, expect);
        Dev<int32_t> i32(g_rank == 0 ? -5 : 7 * g_rank), i32r(0);
        int32_t i32e = -5;
        for (int r = 1; r < nranks; r++) i32e += 7 * r;
        if (ok("i32 sum", ncclAllReduce(i32.p, i32r.p, 1, ncclInt32, ncclSum, comm, nullptr), comm))
            CHECK(*i32r == i32e, "i32 sum %d, expected %d", *i32r, i32e);
        Dev<int32_t> a(1 << g_rank), ar(0);
        int32_t ae = (1 << nranks) - 1;
        if (ok("i32 avg", ncclAllReduce(a.p, ar.p, 1, ncclInt32, ncclAvg, comm, nullptr), comm))
            CHECK(*ar == ae / nranks, "i32 avg %d, expected %d", *ar, ae / nranks);
        Dev<int64_t> i64((int64_t)(g_rank + 1) << 40), i64r(0);
        if (ok("i64 max", ncclAllReduce(i64.p, i64r.p, 1, ncclInt64, ncclMax, comm, nullptr), comm))
            CHECK(*i64r == (int64_t)nranks << 40, "i64 max %lld", (long long)*i64r);
        Dev<uint8_t> u8(200), u8r(0);
        if (ok("u8 sum", ncclAllReduce(u8.p, u8r.p, 1, ncclUint8, ncclSum, comm, nullptr), comm))
            CHECK(*u8r == (uint8_t)(200 * nranks), "u8 sum %u (wraps)", *u8r);
        publish(recv.p, 8);
    }
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

void scenario_scatter_gather(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    const size_t rc = 5;
    auto part = [&](int r, int d, size_t i) { return (float)(r * 100 + d * 10) + (float)i * 0.25f; };
    // ReduceScatter, out of place.
    {
        dvec<float> send(nranks * rc), recv(rc, NAN);
        for (int d = 0; d < nranks; d++)
            for (size_t i = 0; i < rc; i++) send[d * rc + i] = part(g_rank, d, i);
        if (ok("reduce-scatter",
               ncclReduceScatter(send.data(), recv.data(), rc, ncclFloat32, ncclSum, comm, nullptr),
               comm)) {
            for (size_t i = 0; i < rc; i++) {
                float e = part(0, g_rank, i);
                for (int r = 1; r < nranks; r++) e += part(r, g_rank, i);
                CHECK(fbits(recv[i]) == fbits(e), "reduce-scatter [%zu] %g, expected %g", i, recv[i],
                      e);
            }
        }
    }
    // ReduceScatter in place: recvbuff = sendbuff + rank * recvcount.
    {
        dvec<float> buf(nranks * rc);
        for (int d = 0; d < nranks; d++)
            for (size_t i = 0; i < rc; i++) buf[d * rc + i] = part(g_rank, d, i);
        float* out = buf.data() + g_rank * rc;
        if (ok("in-place reduce-scatter",
               ncclReduceScatter(buf.data(), out, rc, ncclFloat32, ncclMax, comm, nullptr), comm)) {
            for (size_t i = 0; i < rc; i++) {
                float e = part(nranks - 1, g_rank, i);
                CHECK(out[i] == e, "in-place reduce-scatter max [%zu] %g, expected %g", i, out[i], e);
            }
        }
    }
    // AllGather, out of place and in place (sendbuff = recvbuff + rank * sendcount).
    const size_t sc = 4;
    auto val = [](int k, size_t i) { return (float)(k * 10) + (float)i; };
    {
        dvec<float> send(sc), recv(nranks * sc, NAN);
        for (size_t i = 0; i < sc; i++) send[i] = val(g_rank, i);
        if (ok("all-gather", ncclAllGather(send.data(), recv.data(), sc, ncclFloat32, comm, nullptr),
               comm))
            for (int k = 0; k < nranks; k++)
                for (size_t i = 0; i < sc; i++)
                    CHECK(recv[k * sc + i] == val(k, i), "all-gather [%d][%zu] %g", k, i,
                          recv[k * sc + i]);
        publish(recv.data(), recv.size() * 4);
    }
    {
        dvec<float> buf(nranks * sc, NAN);
        for (size_t i = 0; i < sc; i++) buf[g_rank * sc + i] = val(g_rank, i);
        if (ok("in-place all-gather",
               ncclAllGather(buf.data() + g_rank * sc, buf.data(), sc, ncclFloat32, comm, nullptr),
               comm))
            for (int k = 0; k < nranks; k++)
                for (size_t i = 0; i < sc; i++)
                    CHECK(buf[k * sc + i] == val(k, i), "in-place all-gather [%d][%zu] %g", k, i,
                          buf[k * sc + i]);
    }
    // bf16 ReduceScatter and uint8 AllGather.
    {
        dvec<uint16_t> send(nranks * 3, 0x3f80), recv(3, 0);  // all 1.0
        if (ok("bf16 reduce-scatter",
               ncclReduceScatter(send.data(), recv.data(), 3, ncclBfloat16, ncclSum, comm, nullptr),
               comm))
            for (int i = 0; i < 3; i++)
                CHECK(bf16f(recv[i]) == (float)nranks, "bf16 reduce-scatter %g", bf16f(recv[i]));
        Dev<uint8_t> b((uint8_t)(g_rank + 1));
        dvec<uint8_t> gathered(nranks, 0);
        if (ok("u8 all-gather", ncclAllGather(b.p, gathered.data(), 1, ncclUint8, comm, nullptr), comm))
            for (int k = 0; k < nranks; k++)
                CHECK(gathered[k] == k + 1, "u8 all-gather [%d] = %u", k, gathered[k]);
    }
    // Broadcast from rank 1, out of place and in place.
    {
        dvec<int32_t> send(7), recv(7, -1);
        for (int i = 0; i < 7; i++) send[i] = g_rank * 1000 + i;
        if (ok("broadcast",
               ncclBroadcast(send.data(), recv.data(), 7, ncclInt32, 1, comm, nullptr), comm))
            for (int i = 0; i < 7; i++) CHECK(recv[i] == 1000 + i, "broadcast [%d] %d", i, recv[i]);
        if (ok("in-place broadcast", ncclBcast(send.data(), 7, ncclInt32, 1, comm, nullptr), comm))
            for (int i = 0; i < 7; i++)
                CHECK(send[i] == 1000 + i, "in-place broadcast [%d] %d", i, send[i]);
    }
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

// Buffers many times the staging area (TERSE_FAKE_GPU_NCCL_STAGING=64K: 32 KiB per chunk).
void scenario_large(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    const size_t n = 100003;
    auto v = [](int r, size_t i) { return (float)((i * 131 + (size_t)r * 977) % 1009) * 0.5f - 200.f; };
    {
        dvec<float> buf(n);
        for (size_t i = 0; i < n; i++) buf[i] = v(g_rank, i);
        if (ok("large all-reduce",
               ncclAllReduce(buf.data(), buf.data(), n, ncclFloat32, ncclSum, comm, nullptr), comm)) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float e = v(0, i);
                for (int r = 1; r < nranks; r++) e += v(r, i);
                bad += fbits(buf[i]) != fbits(e);
            }
            CHECK(bad == 0, "large all-reduce: %zu of %zu values wrong", bad, n);
        }
        publish(buf.data(), n * 4);
    }
    {
        const size_t rc = 40009;
        dvec<float> send(rc * nranks), recv(rc, NAN);
        for (size_t i = 0; i < send.size(); i++) send[i] = v(g_rank, i);
        if (ok("large reduce-scatter",
               ncclReduceScatter(send.data(), recv.data(), rc, ncclFloat32, ncclSum, comm, nullptr),
               comm)) {
            size_t bad = 0;
            for (size_t i = 0; i < rc; i++) {
                size_t j = g_rank * rc + i;
                float e = v(0, j);
                for (int r = 1; r < nranks; r++) e += v(r, j);
                bad += fbits(recv[i]) != fbits(e);
            }
            CHECK(bad == 0, "large reduce-scatter: %zu of %zu values wrong", bad, rc);
        }
        dvec<float> gathered(rc * nranks, NAN);
        if (ok("large all-gather",
               ncclAllGather(recv.data(), gathered.data(), rc, ncclFloat32, comm, nullptr), comm)) {
            size_t bad = 0;
            for (size_t j = 0; j < gathered.size(); j++) {
                float e = v(0, j);
                for (int r = 1; r < nranks; r++) e += v(r, j);
                bad += fbits(gathered[j]) != fbits(e);
            }
            CHECK(bad == 0, "large all-gather: %zu of %zu values wrong", bad, gathered.size());
        }
        publish(gathered.data(), gathered.size() * 4);
    }
    {
        const size_t m = 70001;
        dvec<uint16_t> send(m), recv(m);
        for (size_t i = 0; i < m; i++) send[i] = to_bf16(v(g_rank, i) / 16.f);
        if (ok("large bf16 all-reduce",
               ncclAllReduce(send.data(), recv.data(), m, ncclBfloat16, ncclAvg, comm, nullptr),
               comm)) {
            size_t bad = 0;
            for (size_t i = 0; i < m; i++) {
                float e = bf16f(to_bf16(v(0, i) / 16.f));
                for (int r = 1; r < nranks; r++) e += bf16f(to_bf16(v(r, i) / 16.f));
                bad += recv[i] != to_bf16(e / (float)nranks);
            }
            CHECK(bad == 0, "large bf16 avg: %zu of %zu values wrong", bad, m);
        }
        publish(recv.data(), m * 2);
    }
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

}  // namespace
