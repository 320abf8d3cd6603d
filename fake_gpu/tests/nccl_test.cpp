// Tests of the emulated NCCL (fake_gpu/nccl/): ranks are fork()ed processes, as under
// `cargo xtask train --nproc N`; prints one line per failure and exits nonzero on any.
// `cargo xtask fake-gpu --self-test` builds and runs it against target/fake-gpu/lib.
#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fake_gpu.h"

namespace {

const char* g_scenario = "";
int g_rank = -1;
int g_failures = 0;  // in this process

void fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::printf("FAIL %s rank %d: %s\n", g_scenario, g_rank, buf);
    std::fflush(stdout);
    g_failures++;
}

#define CHECK(cond, ...)            \
    do {                            \
        if (!(cond)) fail(__VA_ARGS__); \
    } while (0)

// Device memory (fake_gpu.h): ncclAllReduce & co. check that their buffers lie in live device
// blocks of libcuda.so.1.
template <class T>
struct DevAlloc {
    using value_type = T;
    DevAlloc() = default;
    template <class U>
    DevAlloc(const DevAlloc<U>&) {}
    T* allocate(size_t n) { return reinterpret_cast<T*>(fake_gpu::alloc(n * sizeof(T))); }
    void deallocate(T* p, size_t) { fake_gpu::release(reinterpret_cast<uint64_t>(p), "nccl_test"); }
    bool operator==(const DevAlloc&) const { return true; }
    bool operator!=(const DevAlloc&) const { return false; }
};
template <class T>
using dvec = std::vector<T, DevAlloc<T>>;
template <class T>
dvec<T> dev(const std::vector<T>& v) {
    return dvec<T>(v.begin(), v.end());
}
// One device value.
template <class T>
struct Dev {
    T* p;
    explicit Dev(T v) : p(reinterpret_cast<T*>(fake_gpu::alloc(sizeof(T)))) { *p = v; }
    ~Dev() { fake_gpu::release(reinterpret_cast<uint64_t>(p), "nccl_test"); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    T operator*() const { return *p; }
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Results every rank publishes, for the parent to compare bit for bit across ranks.
constexpr int kMaxRanks = 4, kMaxDigests = 64;
struct Shared {
    uint64_t digest[kMaxRanks][kMaxDigests];
    int used[kMaxRanks];
};
Shared* g_shared = nullptr;
ncclUniqueId g_id2;  // a second id, for the scenario with two communicators
constexpr int kRounds = 40;
ncclUniqueId g_round_ids[kRounds];  // fresh ids for the teardown scenario

uint64_t fnv(const void* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
    return h;
}

void publish(const void* p, size_t n) {
    int& u = g_shared->used[g_rank];
    if (u < kMaxDigests) g_shared->digest[g_rank][u++] = fnv(p, n);
}

std::string shm_name(const ncclUniqueId& id) { return std::string(id.internal + 24); }

bool shm_exists(const ncclUniqueId& id) {
    return access(("/dev/shm" + shm_name(id)).c_str(), F_OK) == 0;
}

ncclConfig_t nonblocking() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

// Like terse's deadline.rs: poll ncclCommGetAsyncError until it is not ncclInProgress (or the
// deadline passes); returns what it saw.
// Synchronises the default stream first (the collectives' work runs there; in the late mode,
// TERSE_FAKE_GPU_LATE=1, only at a synchronisation point).
ncclResult_t poll_async(ncclComm_t comm, double timeout_s, bool* saw_progress = nullptr) {
    fake_gpu::sync_stream(nullptr);
    double end = now_s() + timeout_s;
    for (;;) {
        ncclResult_t st = ncclNumResults;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return r;
        if (st != ncclInProgress) return st;
        if (saw_progress) *saw_progress = true;
        if (now_s() > end) return ncclInProgress;
        usleep(200);
    }
}

// A non-blocking communicator, polled to success.
ncclComm_t init(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = nullptr;
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, g_rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        fail("ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        return nullptr;
    }
    ncclResult_t st = poll_async(comm, 20);
    if (st != ncclSuccess) {
        fail("initialisation ended with %s", ncclGetErrorString(st));
        ncclCommAbort(comm);
        return nullptr;
    }
    return comm;
}

// Runs one collective and polls it like terse does; false (with a failure line) on an error.
bool ok(const char* what, ncclResult_t r, ncclComm_t comm) {
    if (r != ncclSuccess) {
        fail("%s returned %s", what, ncclGetErrorString(r));
        return false;
    }
    ncclResult_t st = poll_async(comm, 20);
    if (st != ncclSuccess) {
        fail("%s: asynchronous %s", what, ncclGetErrorString(st));
        return false;
    }
    return true;
}

uint32_t fbits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}
uint64_t dbits(double f) {
    uint64_t b;
    std::memcpy(&b, &f, 8);
    return b;
}
float bf16f(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
// The test's own f32 -> bf16 rounding: exact in double, nearest with ties to even mantissa.
uint16_t to_bf16(float f) {
    uint32_t b = fbits(f);
    uint16_t lo = (uint16_t)(b >> 16), hi = (uint16_t)(lo + 1);
    double dl = bf16f(lo), dh = bf16f(hi), x = f;
    double el = std::fabs(x - dl), eh = std::fabs(dh - x);
    if (el < eh) return lo;
    if (eh < el) return hi;
    return (lo & 1) ? hi : lo;
}

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

// Rank 1 dies (no abort) after the join: rank 0's collective fails fast (a dead process is seen).
void scenario_dead_rank(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    if (g_rank == 1) {
        std::fflush(stdout);
        _exit(g_failures);  // a crash: the communicator is never aborted
    }
    usleep(100000);
    Dev<float> x(1), y(0);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(x.p, y.p, 1, ncclFloat32, ncclSum, comm, nullptr);
    CHECK(r == ncclSuccess, "ncclAllReduce returned %s (the error should be asynchronous)",
          ncclGetErrorString(r));
    ncclResult_t st = poll_async(comm, 10);
    double took = now_s() - t0;
    CHECK(st == ncclRemoteError, "after a peer died, ncclCommGetAsyncError says %s",
          ncclGetErrorString(st));
    CHECK(took < 3.0, "the dead peer took %.2f s to notice (timeout 3 s)", took);
    CHECK(std::isnan(*y), "the failed all-reduce left %g in its receive buffer, not NaN", *y);
    double t1 = now_s();
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
    CHECK(now_s() - t1 < 0.5, "ncclCommAbort took %.2f s", now_s() - t1);
}

// Rank 1 is alive but late past the timeout (2 s): rank 0 gets ncclRemoteError at the deadline
// and aborts (as terse's deadline.rs does); rank 1's late collective then fails at once.
void scenario_stuck_rank(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    Dev<float> x(1), y(0);
    if (g_rank == 1) {
        usleep(3500000);
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(x.p, y.p, 1, ncclFloat32, ncclSum, comm, nullptr);
        ncclResult_t st = r == ncclSuccess ? poll_async(comm, 10) : r;
        CHECK(st == ncclRemoteError, "the late rank saw %s", ncclGetErrorString(st));
        CHECK(now_s() - t0 < 1.0, "the late rank took %.2f s to see its peer gone", now_s() - t0);
        CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
        return;
    }
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(x.p, y.p, 1, ncclFloat32, ncclSum, comm, nullptr);
    CHECK(r == ncclSuccess, "ncclAllReduce returned %s", ncclGetErrorString(r));
    ncclResult_t st = poll_async(comm, 10);
    double took = now_s() - t0;
    CHECK(st == ncclRemoteError, "ncclCommGetAsyncError says %s", ncclGetErrorString(st));
    CHECK(took > 1.5 && took < 3.5, "the error came after %.2f s (timeout 2 s)", took);
    double t1 = now_s();
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
    CHECK(now_s() - t1 < 0.5, "ncclCommAbort took %.2f s", now_s() - t1);
}

// Rank 1 never joins: rank 0's non-blocking initialisation ends in an error at the timeout
// (1.5 s); abort is prompt and the segment's name is gone.
void scenario_never_joins(int nranks, const ncclUniqueId& id) {
    if (g_rank != 0) return;
    ncclComm_t comm = nullptr;
    ncclConfig_t cfg = nonblocking();
    double t0 = now_s();
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, 0, &cfg);
    CHECK(r == ncclInProgress, "ncclCommInitRankConfig returned %s", ncclGetErrorString(r));
    if (!comm) return fail("no communicator");
    ncclResult_t st = poll_async(comm, 10);
    double took = now_s() - t0;
    CHECK(st == ncclRemoteError, "initialisation ended with %s", ncclGetErrorString(st));
    CHECK(took > 1.0 && took < 3.0, "the error came after %.2f s (timeout 1.5 s)", took);
    double t1 = now_s();
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
    CHECK(now_s() - t1 < 0.5, "ncclCommAbort took %.2f s", now_s() - t1);
    CHECK(!shm_exists(id), "the segment %s outlived the abort", shm_name(id).c_str());
}

// terse's deadline fires during initialisation: ncclCommAbort must stop it promptly.
void scenario_abort_during_init(int nranks, const ncclUniqueId& id) {
    if (g_rank != 0) return;
    ncclComm_t comm = nullptr;
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, 0, &cfg);
    CHECK(r == ncclInProgress, "ncclCommInitRankConfig returned %s", ncclGetErrorString(r));
    if (!comm) return fail("no communicator");
    usleep(200000);
    ncclResult_t st = ncclNumResults;
    ncclCommGetAsyncError(comm, &st);
    CHECK(st == ncclInProgress, "a half-joined communicator says %s", ncclGetErrorString(st));
    double t1 = now_s();
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
    CHECK(now_s() - t1 < 0.5, "ncclCommAbort during initialisation took %.2f s", now_s() - t1);
    CHECK(!shm_exists(id), "the segment %s outlived the abort", shm_name(id).c_str());
}

// Ranks that disagree on a collective's count both get ncclInvalidUsage, quickly.
void scenario_mismatch(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    dvec<float> buf(12, 1.0f);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), g_rank == 0 ? 10 : 12, ncclFloat32,
                                   ncclSum, comm, nullptr);
    ncclResult_t st = r == ncclSuccess ? poll_async(comm, 10) : r;
    CHECK(st == ncclInvalidUsage || st == ncclRemoteError, "mismatched counts gave %s",
          ncclGetErrorString(st));
    CHECK(now_s() - t0 < 1.0, "mismatched counts took %.2f s", now_s() - t0);
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

// World size 1 (terse's gpu-check): every collective is the identity; blocking initialisation.
void scenario_world_one(int, const ncclUniqueId& id) {
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
    CHECK(r == ncclSuccess && comm, "ncclCommInitRank at world 1: %s", ncclGetErrorString(r));
    if (!comm) return;
    dvec<float> a = {1.5f, -2.f, NAN, 1e30f}, b(4, 0.f);
    ok("world-1 all-reduce", ncclAllReduce(a.data(), b.data(), 4, ncclFloat32, ncclAvg, comm, nullptr),
       comm);
    CHECK(std::memcmp(a.data(), b.data(), 16) == 0, "world-1 all-reduce changed values");
    ok("world-1 reduce-scatter",
       ncclReduceScatter(a.data(), b.data(), 4, ncclFloat32, ncclSum, comm, nullptr), comm);
    CHECK(std::memcmp(a.data(), b.data(), 16) == 0, "world-1 reduce-scatter changed values");
    ok("world-1 all-gather", ncclAllGather(a.data(), a.data(), 4, ncclFloat32, comm, nullptr), comm);
    CHECK(std::memcmp(a.data(), b.data(), 16) == 0, "world-1 in-place all-gather changed values");
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
    CHECK(!shm_exists(id), "a world-1 communicator left a segment");
}

// Two communicators over the same ranks, used alternately, then destroyed normally.
void scenario_two_comms(int nranks, const ncclUniqueId& id) {
    ncclComm_t a = init(nranks, id), b = init(nranks, g_id2);
    if (!a || !b) return;
    for (int it = 0; it < 50; it++) {
        Dev<int32_t> x(g_rank + it), ya(0), yb(0);
        if (!ok("comm a", ncclAllReduce(x.p, ya.p, 1, ncclInt32, ncclSum, a, nullptr), a)) break;
        if (!ok("comm b", ncclAllReduce(x.p, yb.p, 1, ncclInt32, ncclMax, b, nullptr), b)) break;
        int32_t es = 0;
        for (int r = 0; r < nranks; r++) es += r + it;
        CHECK(*ya == es && *yb == nranks - 1 + it, "iteration %d: sum %d max %d", it, *ya, *yb);
    }
    CHECK(ncclCommFinalize(a) == ncclSuccess, "ncclCommFinalize");
    CHECK(ncclCommDestroy(a) == ncclSuccess, "ncclCommDestroy a");
    CHECK(ncclCommDestroy(b) == ncclSuccess, "ncclCommDestroy b");
}

// Many small collectives back to back, then an immediate abort (terse's drop): the teardown of
// a rank that finished first must not fail a peer still leaving its last wait.
void scenario_stress(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = init(nranks, id);
    if (!comm) return;
    for (int it = 0; it < 300; it++) {
        dvec<float> x(6), y(6), z(2 * 6);
        for (int i = 0; i < 6; i++) x[i] = (float)(g_rank + it + i);
        if (!ok("stress all-reduce", ncclAllReduce(x.data(), y.data(), 6, ncclFloat32, ncclSum, comm, nullptr), comm))
            break;
        if (!ok("stress reduce-scatter",
                ncclReduceScatter(x.data(), y.data(), 6 / nranks, ncclFloat32, ncclMax, comm, nullptr), comm))
            break;
        if (!ok("stress all-gather", ncclAllGather(x.data(), z.data(), 2, ncclFloat32, comm, nullptr), comm))
            break;
        for (int k = 0; k < nranks; k++)
            CHECK(z[2 * k] == (float)(k + it), "stress all-gather %d: [%d] %g", it, k, z[2 * k]);
    }
    CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
}

// Communicators made, used once and aborted at once, kRounds times, with rank 0 arriving last:
// the others are asleep in the wait when it passes and leaves.
void scenario_teardown(int nranks, const ncclUniqueId&) {
    for (int round = 0; round < kRounds; round++) {
        ncclComm_t comm = init(nranks, g_round_ids[round]);
        if (!comm) return;
        if (g_rank == 0) usleep(3000);
        Dev<int32_t> x(1), y(0);
        if (ok("teardown all-reduce", ncclAllReduce(x.p, y.p, 1, ncclInt32, ncclSum, comm, nullptr),
               comm))
            CHECK(*y == nranks, "teardown round %d: sum %d", round, *y);
        CHECK(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
        if (g_failures) return;
    }
}

struct Scenario {
    const char* name;
    int nranks;
    void (*run)(int, const ncclUniqueId&);
    const char* timeout_s;  // TERSE_FAKE_GPU_NCCL_TIMEOUT_S
    const char* staging;    // TERSE_FAKE_GPU_NCCL_STAGING (null: default)
};

// Forks the ranks, waits for them (at most 60 s), and returns the failures they report.
int run_scenario(const Scenario& s, std::vector<ncclUniqueId>& ids) {
    g_scenario = s.name;
    setenv("TERSE_FAKE_GPU_NCCL_TIMEOUT_S", s.timeout_s, 1);
    if (s.staging)
        setenv("TERSE_FAKE_GPU_NCCL_STAGING", s.staging, 1);
    else
        unsetenv("TERSE_FAKE_GPU_NCCL_STAGING");
    ncclUniqueId id[2];
    for (ncclUniqueId& i : id) {
        if (ncclGetUniqueId(&i) != ncclSuccess) {
            std::printf("FAIL %s: ncclGetUniqueId\n", s.name);
            return 1;
        }
        ids.push_back(i);
    }
    g_id2 = id[1];
    for (ncclUniqueId& i : g_round_ids) ncclGetUniqueId(&i);
    std::memset(g_shared, 0, sizeof *g_shared);
    std::vector<pid_t> pids;
    for (int r = 0; r < s.nranks; r++) {
        std::fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            g_rank = r;
            s.run(s.nranks, id[0]);
            std::fflush(stdout);
            _exit(std::min(g_failures, 100));
        }
        pids.push_back(p);
    }
    int failures = 0;
    double end = now_s() + 60;
    size_t left = pids.size();
    std::vector<bool> done(pids.size(), false);
    while (left > 0) {
        for (size_t i = 0; i < pids.size(); i++) {
            if (done[i]) continue;
            int status = 0;
            if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                done[i] = true;
                left--;
                if (WIFEXITED(status)) {
                    failures += WEXITSTATUS(status);
                } else {
                    std::printf("FAIL %s rank %zu: killed by signal %d\n", s.name, i,
                                WTERMSIG(status));
                    failures++;
                }
            }
        }
        if (left > 0 && now_s() > end) {
            for (size_t i = 0; i < pids.size(); i++)
                if (!done[i]) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], nullptr, 0);
                    done[i] = true;
                    std::printf("FAIL %s rank %zu: hung (killed after 60 s)\n", s.name, i);
                    failures++;
                }
            left = 0;
        }
        usleep(2000);
    }
    // Bit identity across ranks of every published result.
    for (int r = 1; r < s.nranks; r++) {
        if (g_shared->used[r] != g_shared->used[0]) {
            std::printf("FAIL %s: rank %d published %d results, rank 0 %d\n", s.name, r,
                        g_shared->used[r], g_shared->used[0]);
            failures++;
            continue;
        }
        for (int j = 0; j < g_shared->used[0]; j++)
            if (g_shared->digest[r][j] != g_shared->digest[0][j]) {
                std::printf("FAIL %s: result %d differs between rank 0 and rank %d\n", s.name, j, r);
                failures++;
            }
    }
    return failures;
}

}  // namespace

int main() {
    g_shared = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (g_shared == MAP_FAILED) {
        std::printf("FAIL mmap\n");
        return 1;
    }
    const Scenario scenarios[] = {
        {"init", 3, scenario_init, "20", nullptr},
        {"allreduce", 3, scenario_allreduce, "20", nullptr},
        {"allreduce-2", 2, scenario_allreduce, "20", nullptr},
        {"scatter-gather", 3, scenario_scatter_gather, "20", nullptr},
        {"large", 3, scenario_large, "20", "64K"},
        {"dead-rank", 2, scenario_dead_rank, "3", nullptr},
        {"stuck-rank", 2, scenario_stuck_rank, "2", nullptr},
        {"never-joins", 2, scenario_never_joins, "1.5", nullptr},
        {"abort-during-init", 2, scenario_abort_during_init, "30", nullptr},
        {"mismatch", 2, scenario_mismatch, "20", nullptr},
        {"world-one", 1, scenario_world_one, "20", nullptr},
        {"two-comms", 3, scenario_two_comms, "20", nullptr},
        {"stress", 3, scenario_stress, "20", nullptr},
        {"stress-2", 2, scenario_stress, "20", nullptr},
        {"teardown", 3, scenario_teardown, "20", "64K"},
    };
    std::printf("nccl_test: the failure scenarios (dead, stuck, never-joining and mismatched ranks) "
                "print their expected 'terse fake-gpu: NCCL rank ...' lines on stderr\n");
    int failures = 0;
    std::vector<ncclUniqueId> ids;
    for (const Scenario& s : scenarios) failures += run_scenario(s, ids);
    // Unique ids: all distinct.
    g_scenario = "unique-id";
    for (size_t i = 0; i < ids.size(); i++)
        for (size_t j = i + 1; j < ids.size(); j++)
            if (shm_name(ids[i]) == shm_name(ids[j])) {
                std::printf("FAIL unique-id: two ids share %s\n", shm_name(ids[i]).c_str());
                failures++;
            }
    // No segment left behind in /dev/shm (every name carries this process's pid).
    std::string prefix = "terse-nccl-" + std::to_string(getpid()) + "-";
    if (DIR* d = opendir("/dev/shm")) {
        while (dirent* e = readdir(d))
            if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
                std::printf("FAIL leftovers: /dev/shm/%s\n", e->d_name);
                shm_unlink((std::string("/") + e->d_name).c_str());
                failures++;
            }
        closedir(d);
    }
    if (failures == 0)
        std::printf("nccl_test: all %zu scenarios passed\n", sizeof scenarios / sizeof *scenarios);
    else
        std::printf("nccl_test: %d failures\n", failures);
    return failures == 0 ? 0 : 1;
}
