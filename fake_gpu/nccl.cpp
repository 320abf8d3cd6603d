// terse's emulated NCCL (libnccl.so.2): communicators between rank processes on one machine over a
// POSIX shared-memory segment named in the unique id; collectives reduce in rank order, so every
// rank gets the same bits, and no wait is unbounded.
//
// Layout of a communicator's segment (/dev/shm/<name from the id>): a Header (sizes, a join
// counter, a barrier counter, one Slot per rank), then one staging area per rank, split in two
// halves used alternately by successive chunks. A collective moves its buffers through the
// staging areas chunk by chunk: each rank copies its chunk into its own area, all ranks meet at a
// barrier, each rank reads every area in rank order into its receive buffer. Two halves mean one
// barrier per chunk: a rank refills half h only after the next chunk's barrier, which no rank
// reaches before it has finished reading half h.
//
// Joining: whoever opens the name first (O_CREAT|O_EXCL) sizes it (posix_fallocate, so a full
// /dev/shm is an error, never a SIGBUS later; the staging shrinks to fit) and writes the header
// last; the others wait for the header. The last rank to join unlinks the name: the mapping stays,
// and a crash later leaks nothing. A rank that leaves (abort, destroy, an error) marks its slot;
// the others' waits see that, a peer process that died (or is a zombie), or the deadline, and the
// communicator records ncclRemoteError for ncclCommGetAsyncError instead of hanging.
//
// Settings: TERSE_FAKE_GPU_NCCL_TIMEOUT_S (seconds, may be fractional; default 1800, the default
// of the launcher's --timeout, because rank 0 may evaluate for minutes while its peers wait in a
// collective) bounds every wait for a live peer: a collective's stream work runs on the caller's
// thread, so terse's own deadline cannot fire before this one. A peer that exits or leaves is
// noticed within about 0.1 s whatever the timeout. TERSE_FAKE_GPU_NCCL_STAGING (bytes, K/M/G
// suffix allowed, default 16M, at least 4K) is the staging per rank, read by ncclGetUniqueId and
// carried in the id.

#include <fcntl.h>
#include <linux/futex.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "fake_gpu.h"

namespace {

// ---- The unique id: self-contained bytes (they travel over terse's TCP rendezvous).
constexpr char kIdMagic[8] = {'T', 'R', 'S', 'N', 'C', 'C', 'L', '1'};
constexpr size_t kIdStagingOffset = 8;  // u64: staging bytes per rank
constexpr size_t kIdNameOffset = 24;    // NUL-terminated shm name
constexpr size_t kIdNameMax = NCCL_UNIQUE_ID_BYTES - kIdNameOffset - 1;
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId");

constexpr uint64_t kSegMagic = 0x32534d48534e4354ull;  // header ready
constexpr int kMaxRanks = 256;
constexpr uint64_t kMinStaging = 4096;
constexpr uint64_t kMaxStaging = 1ull << 30;
constexpr uint64_t kDefaultStaging = 16ull << 20;
constexpr double kDefaultTimeout = 1800.0;

enum Kind : uint32_t { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kReduce };

const char* kind_name(uint32_t k) {
    switch (k) {
        case kAllReduce: return "ncclAllReduce";
        case kReduceScatter: return "ncclReduceScatter";
        case kAllGather: return "ncclAllGather";
        case kBroadcast: return "ncclBroadcast";
        case kReduce: return "ncclReduce";
    }
    return "?";
}

// What a rank called, compared across ranks at a collective's first barrier.
struct Desc {
    uint64_t count;
    uint32_t kind, dtype, op;
    int32_t root;
    bool operator==(const Desc& o) const {
        return count == o.count && kind == o.kind && dtype == o.dtype && op == o.op &&
               root == o.root;
    }
};

struct alignas(64) Slot {
    std::atomic<int32_t> pid;    // the rank's process, 0 until it joins
    std::atomic<uint32_t> gone;  // 1 once it left (abort, destroy, error)
    std::atomic<uint32_t> failed;  // 1 once it gave up on a wait (its arrival may still count)
    Desc desc[2];                // per staging half (see the file comment)
};

struct Header {
    std::atomic<uint64_t> magic;  // kSegMagic once the fields below are set
    uint32_t nranks;
    uint32_t pad;
    uint64_t staging;  // bytes per rank (two halves)
    uint64_t total;    // bytes of the segment
    alignas(64) std::atomic<uint32_t> joined;
    alignas(64) std::atomic<uint32_t> arrivals;  // barrier b is passed at b * nranks
    alignas(64) std::atomic<uint32_t> unlinked;
    Slot slots[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics");
constexpr size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void futex_wait(std::atomic<uint32_t>* w, uint32_t seen, double seconds) {
    if (seconds <= 0) return;
    timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* w) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// A peer process that exited: gone, or a zombie its parent has not reaped yet.
bool process_gone(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE* f = std::fopen(path, "r");
    if (!f) return false;
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* close = std::strrchr(buf, ')');
    if (!close || close[1] != ' ') return false;
    return close[2] == 'Z' || close[2] == 'X';
}

double timeout_setting() {
    const char* s = std::getenv("TERSE_FAKE_GPU_NCCL_TIMEOUT_S");
    if (!s || !*s) return kDefaultTimeout;
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end || !(v > 0) || !std::isfinite(v))
        fake_gpu::die(std::string("TERSE_FAKE_GPU_NCCL_TIMEOUT_S=") + s +
                      ": not a positive number of seconds");
    return v;
}

uint64_t staging_setting() {
    const char* s = std::getenv("TERSE_FAKE_GPU_NCCL_STAGING");
    if (!s || !*s) return kDefaultStaging;
    char* end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    uint64_t mult = 1;
    if (end != s && *end) {
        switch (*end) {
            case 'k': case 'K': mult = 1ull << 10; break;
            case 'm': case 'M': mult = 1ull << 20; break;
            case 'g': case 'G': mult = 1ull << 30; break;
            default: mult = 0;
        }
        if (end[1]) mult = 0;
    }
    if (end == s || mult == 0 || v == 0)
        fake_gpu::die(std::string("TERSE_FAKE_GPU_NCCL_STAGING=") + s +
                      ": not a size in bytes (K, M or G suffix allowed)");
    uint64_t bytes = (uint64_t)v * mult;
    return std::min(kMaxStaging, std::max(kMinStaging, bytes)) / 64 * 64;
}

size_t elt_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

bool reducible(ncclDataType_t t) {
    return elt_size(t) != 0 && t != ncclFloat8e4m3 && t != ncclFloat8e5m2;
}

// ---- Element types: f16 and bf16 are reduced in f32 and rounded (to nearest even) once.
float bf16_to_f32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);  // quiet NaN
    b += 0x7fffu + ((b >> 16) & 1);
    return (uint16_t)(b >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t b;
    if (exp == 0) {
        float v = std::ldexp((float)mant, -24);
        return sign ? -v : v;
    } else if (exp == 31) {
        b = sign | 0x7f800000u | (mant << 13);
    } else {
        b = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
    uint32_t abs = b & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00;  // NaN
    float a;
    std::memcpy(&a, &abs, 4);
    if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity (or is one)
    if (a < 6.103515625e-05f) {               // below 2^-14: a subnormal (or zero) result
        return sign | (uint16_t)std::nearbyint(a * 16777216.0f);  // units of 2^-24, RNE
    }
    uint32_t exp = (abs >> 23) - 112, mant = abs & 0x7fffff;
    uint32_t h = (exp << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

template <class T>
struct Plain {
    using Elem = T;
    using Acc = T;
    static Acc load(T v) { return v; }
    static T store(Acc a) { return a; }
};
struct Bf16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return bf16_to_f32(v); }
    static uint16_t store(Acc a) { return f32_to_bf16(a); }
};
struct F16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return f16_to_f32(v); }
    static uint16_t store(Acc a) { return f32_to_f16(a); }
};

// Integer sums and products wrap (as on the device), without signed-overflow UB.
template <class A>
A op_add(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return (A)(U)((U)a + (U)b);
    } else {
        return a + b;
    }
}
template <class A>
A op_mul(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return (A)(U)((U)a * (U)b);
    } else {
        return a * b;
    }
}

// dst[i] = srcs[0][i] op srcs[1][i] op ... (rank order), for i < count; avg divides the sum.
template <class Tr, class F>
void reduce_with(const void* const* srcs, int n, void* dst, size_t count, F f, bool avg) {
    using E = typename Tr::Elem;
    using A = typename Tr::Acc;
    constexpr size_t kBlock = 1024;
    A acc[kBlock];
    E* out = static_cast<E*>(dst);
    for (size_t base = 0; base < count; base += kBlock) {
        size_t m = std::min(kBlock, count - base);
        const E* s0 = static_cast<const E*>(srcs[0]) + base;
        for (size_t j = 0; j < m; j++) acc[j] = Tr::load(s0[j]);
        for (int k = 1; k < n; k++) {
            const E* sk = static_cast<const E*>(srcs[k]) + base;
            for (size_t j = 0; j < m; j++) acc[j] = f(acc[j], Tr::load(sk[j]));
        }
        if (avg) {
            A div = (A)n;
            for (size_t j = 0; j < m; j++) acc[j] = acc[j] / div;
        }
        for (size_t j = 0; j < m; j++) out[base + j] = Tr::store(acc[j]);
    }
}

template <class Tr>
void reduce_typed(const void* const* srcs, int n, void* dst, size_t count, ncclRedOp_t op) {
    using A = typename Tr::Acc;
    switch (op) {
        case ncclSum: reduce_with<Tr>(srcs, n, dst, count, op_add<A>, false); break;
        case ncclAvg: reduce_with<Tr>(srcs, n, dst, count, op_add<A>, true); break;
        case ncclProd: reduce_with<Tr>(srcs, n, dst, count, op_mul<A>, false); break;
        case ncclMax:
            reduce_with<Tr>(srcs, n, dst, count, [](A a, A b) { return a < b ? b : a; }, false);
            break;
        case ncclMin:
            reduce_with<Tr>(srcs, n, dst, count, [](A a, A b) { return b < a ? b : a; }, false);
            break;
        default: break;  // rejected before enqueueing
    }
}

void reduce(const void* const* srcs, int n, void* dst, size_t count, ncclDataType_t t,
            ncclRedOp_t op) {
    switch (t) {
        case ncclInt8: reduce_typed<Plain<int8_t>>(srcs, n, dst, count, op); break;
        case ncclUint8: reduce_typed<Plain<uint8_t>>(srcs, n, dst, count, op); break;
        case ncclInt32: reduce_typed<Plain<int32_t>>(srcs, n, dst, count, op); break;
        case ncclUint32: reduce_typed<Plain<uint32_t>>(srcs, n, dst, count, op); break;
        case ncclInt64: reduce_typed<Plain<int64_t>>(srcs, n, dst, count, op); break;
        case ncclUint64: reduce_typed<Plain<uint64_t>>(srcs, n, dst, count, op); break;
        case ncclFloat16: reduce_typed<F16>(srcs, n, dst, count, op); break;
        case ncclFloat32: reduce_typed<Plain<float>>(srcs, n, dst, count, op); break;
        case ncclFloat64: reduce_typed<Plain<double>>(srcs, n, dst, count, op); break;
        case ncclBfloat16: reduce_typed<Bf16>(srcs, n, dst, count, op); break;
        default: break;  // rejected before enqueueing
    }
}

// ---- One rank's side of a communicator.
struct Coll {
    Kind kind;
    const char* send;
    char* recv;
    size_t count;  // AllReduce/Broadcast/Reduce: count; ReduceScatter: recvcount; AllGather: sendcount
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;
};

struct State {
    int nranks = 0, rank = 0;
    double timeout = kDefaultTimeout;
    std::string name;
    uint64_t staging_req = kDefaultStaging;

    int fd = -1;
    void* base = nullptr;
    size_t size = 0;
    Header* hdr = nullptr;
    bool attached = false;  // this rank's slot is claimed
    bool left = false;      // detach() ran

    std::atomic<int> async{ncclInProgress};
    std::atomic<bool> aborting{false};
    uint32_t barriers = 0;  // barriers passed
    uint64_t chunks = 0;    // chunks moved (their parity picks the staging half)

    std::mutex err_mu;
    std::string last_error;

    ~State() {
        if (base) munmap(base, size);
        if (fd >= 0) close(fd);
    }

    std::string who() const {
        return "NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks);
    }

    // Records the communicator's first error (what ncclCommGetAsyncError reports), says why on
    // stderr, and tells the peers this rank failed and is gone so they fail fast instead of
    // timing out (or completing a barrier this rank arrived at but gave up on).
    ncclResult_t fail(ncclResult_t code, const std::string& why) {
        int cur = async.load();
        while ((cur == ncclSuccess || cur == ncclInProgress) &&
               !async.compare_exchange_weak(cur, code)) {
        }
        {
            std::lock_guard<std::mutex> g(err_mu);
            if (last_error.empty()) {
                last_error = why;
                if (!aborting.load())
                    std::fprintf(stderr, "terse fake-gpu: %s: %s\n", who().c_str(), why.c_str());
            }
        }
        if (hdr && attached) hdr->slots[rank].failed.store(1, std::memory_order_release);
        mark_gone();
        return code;
    }

    void mark_gone() {
        if (hdr && attached) {
            hdr->slots[rank].gone.store(1, std::memory_order_release);
            futex_wake(&hdr->joined);
            futex_wake(&hdr->arrivals);
        }
    }

    void unlink_name() {
        if (hdr && hdr->unlinked.exchange(1) == 0) shm_unlink(name.c_str());
    }

    uint8_t* stage(int k, uint64_t half) const {
        uint64_t h = hdr->staging / 2;
        return static_cast<uint8_t*>(base) + kHeaderBytes + (uint64_t)k * hdr->staging + half * h;
    }

    // Waits until *w reaches target (wrap-safe), a peer is gone or dead, this rank aborts, or the
    // deadline passes.
    ncclResult_t wait_for(std::atomic<uint32_t>* w, uint32_t target, const char* what) {
        auto reached = [&](uint32_t v) { return (int32_t)(v - target) >= 0; };
        // Reached, unless a peer's arrival counted but it gave up waiting (then it reported an
        // error; this rank must not report success for the same collective).
        auto passed = [&]() {
            for (int k = 0; k < nranks; k++)
                if (k != rank && hdr->slots[k].failed.load(std::memory_order_acquire))
                    return fail(ncclRemoteError, std::string(what) + ": rank " +
                                                     std::to_string(k) + " gave up waiting");
            return ncclSuccess;
        };
        for (int i = 0; i < 4000; i++) {
            if (reached(w->load(std::memory_order_acquire))) return passed();
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        // A peer that arrives and then leaves (its normal teardown after the last collective) or
        // exits must not fail a wait it completed: look at the counter again before giving up.
        auto give_up = [&](ncclResult_t code, const std::string& why) {
            if (reached(w->load(std::memory_order_acquire))) return passed();
            return fail(code, std::string(what) + ": " + why);
        };
        double start = now_s(), deadline = start + timeout, next_check = start;
        for (;;) {
            uint32_t v = w->load(std::memory_order_acquire);
            if (reached(v)) return passed();
            if (aborting.load()) return give_up(ncclSystemError, "aborted");
            for (int k = 0; k < nranks; k++) {
                if (k != rank && hdr->slots[k].gone.load(std::memory_order_acquire))
                    return give_up(ncclRemoteError,
                                   "rank " + std::to_string(k) + " left the communicator");
            }
            double t = now_s();
            if (t >= next_check) {
                next_check = t + 0.1;
                pid_t me = getpid();
                for (int k = 0; k < nranks; k++) {
                    pid_t p = hdr->slots[k].pid.load(std::memory_order_acquire);
                    if (k != rank && p > 0 && p != me && process_gone(p))
                        return give_up(ncclRemoteError, "rank " + std::to_string(k) + " (pid " +
                                                            std::to_string(p) + ") exited");
                }
            }
            if (t >= deadline) {
                char secs[32];
                std::snprintf(secs, sizeof secs, "%g", timeout);
                return give_up(ncclRemoteError, std::string("the other ranks did not arrive within ") +
                                                     secs + " s (TERSE_FAKE_GPU_NCCL_TIMEOUT_S)");
            }
            futex_wait(w, v, std::min(0.02, deadline - t));
        }
    }

    ncclResult_t barrier(const char* what) {
        barriers++;
        uint32_t target = barriers * (uint32_t)nranks;
        uint32_t v = hdr->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
        if (v == target) futex_wake(&hdr->arrivals);
        return wait_for(&hdr->arrivals, target, what);
    }

    // Opens (or creates) the segment, claims this rank's slot, waits for every rank.
    ncclResult_t join() {
        if (nranks == 1) {
            async.store(ncclSuccess);
            return ncclSuccess;
        }
        double deadline = now_s() + timeout;
        bool creator = false;
        for (;;) {
            fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
            if (fd >= 0) {
                creator = true;
                break;
            }
            if (errno != EEXIST)
                return fail(ncclSystemError, "shm_open(" + name + "): " + std::strerror(errno));
            fd = shm_open(name.c_str(), O_RDWR, 0);
            if (fd >= 0) break;
            if (errno != ENOENT)
                return fail(ncclSystemError, "shm_open(" + name + "): " + std::strerror(errno));
            if (now_s() >= deadline)  // created and unlinked over and over: give up
                return fail(ncclSystemError, "shm_open(" + name + "): the segment keeps vanishing");
        }
        if (creator) {
            uint64_t staging = staging_req;
            for (;;) {
                uint64_t total = kHeaderBytes + (uint64_t)nranks * staging;
                int e = posix_fallocate(fd, 0, (off_t)total);
                if (e == 0) {
                    size = total;
                    break;
                }
                if (e == ENOSPC && staging / 2 >= kMinStaging) {
                    staging /= 2;
                    continue;
                }
                if (e == ENOSPC || e == EFBIG) {
                    unlink_name_unmapped();
                    return fail(ncclSystemError, "posix_fallocate(" + name + ", " +
                                                     std::to_string(total) +
                                                     " bytes): " + std::strerror(e));
                }
                if (ftruncate(fd, (off_t)total) != 0) {  // no fallocate here: size it lazily
                    int err = errno;
                    unlink_name_unmapped();
                    return fail(ncclSystemError, "ftruncate(" + name + "): " + std::strerror(err));
                }
                size = total;
                break;
            }
            base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (base == MAP_FAILED) {
                base = nullptr;
                int err = errno;
                unlink_name_unmapped();
                return fail(ncclSystemError, "mmap(" + name + "): " + std::strerror(err));
            }
            hdr = static_cast<Header*>(base);
            hdr->nranks = (uint32_t)nranks;
            hdr->staging = staging;
            hdr->total = size;
            hdr->magic.store(kSegMagic, std::memory_order_release);
        } else {
            // The creator's posix_fallocate sets the final size in one step; wait for it.
            struct stat st;
            for (;;) {
                if (fstat(fd, &st) != 0)
                    return fail(ncclSystemError, "fstat(" + name + "): " + std::strerror(errno));
                if ((size_t)st.st_size >= kHeaderBytes) break;
                if (aborting.load()) return fail(ncclSystemError, "initialisation: aborted");
                if (now_s() >= deadline)
                    return fail(ncclRemoteError, "initialisation: the segment " + name +
                                                     " was never sized by its creator");
                usleep(1000);
            }
            size = (size_t)st.st_size;
            base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (base == MAP_FAILED) {
                base = nullptr;
                return fail(ncclSystemError, "mmap(" + name + "): " + std::strerror(errno));
            }
            Header* h = static_cast<Header*>(base);
            while (h->magic.load(std::memory_order_acquire) != kSegMagic) {
                if (aborting.load()) return fail(ncclSystemError, "initialisation: aborted");
                if (now_s() >= deadline)
                    return fail(ncclRemoteError, "initialisation: the segment " + name +
                                                     " was never initialised by its creator");
                usleep(1000);
            }
            if (h->total != size)
                return fail(ncclInternalError, "the segment " + name + " has the wrong size");
            hdr = h;
            if ((int)hdr->nranks != nranks)
                return fail(ncclInvalidUsage, "initialisation: nranks " + std::to_string(nranks) +
                                                  ", but another rank joined with " +
                                                  std::to_string(hdr->nranks));
        }
        int32_t expected = 0;
        if (!hdr->slots[rank].pid.compare_exchange_strong(expected, (int32_t)getpid()))
            return fail(ncclInvalidUsage, "initialisation: rank " + std::to_string(rank) +
                                              " joined twice (also pid " +
                                              std::to_string(expected) + ")");
        attached = true;
        uint32_t n = hdr->joined.fetch_add(1, std::memory_order_acq_rel) + 1;
        if (n == (uint32_t)nranks) {
            unlink_name();  // everyone has it mapped: the name is no longer needed
            futex_wake(&hdr->joined);
        }
        ncclResult_t r = wait_for(&hdr->joined, (uint32_t)nranks, "initialisation");
        if (r != ncclSuccess) return r;
        int cur = ncclInProgress;
        async.compare_exchange_strong(cur, ncclSuccess);
        return (ncclResult_t)async.load();
    }

    // Before the header exists (the creator failed to size or map it).
    void unlink_name_unmapped() { shm_unlink(name.c_str()); }

    // Leaves the communicator (abort or destroy): peers see the slot gone; the name goes.
    void detach() {
        if (left) return;
        left = true;
        if (hdr && attached) mark_gone();
        if (hdr) unlink_name();
        else if (fd >= 0) shm_unlink(name.c_str());  // created or opened, never mapped
    }

    ncclResult_t run(const Coll& c);
    ncclResult_t run_local(const Coll& c);
};

ncclResult_t State::run_local(const Coll& c) {
    size_t esz = elt_size(c.dtype);
    // One rank: every reduction of one value is the value (avg divides by 1, exactly).
    if (c.send != c.recv) std::memmove(c.recv, c.send, c.count * esz);
    return ncclSuccess;
}

ncclResult_t State::run(const Coll& c) {
    if (c.count == 0) return ncclSuccess;
    if (nranks == 1) return run_local(c);
    const char* what = kind_name(c.kind);
    size_t esz = elt_size(c.dtype);
    uint64_t half = hdr->staging / 2 / 64 * 64;
    size_t per = c.kind == kReduceScatter ? half / ((uint64_t)nranks * esz) : half / esz;
    Desc mine{(uint64_t)c.count, (uint32_t)c.kind, (uint32_t)c.dtype, (uint32_t)c.op, c.root};
    const void* srcs[kMaxRanks];
    bool first = true;
    for (size_t off = 0; off < c.count; off += per) {
        size_t n = std::min(per, c.count - off);
        uint64_t h = chunks & 1;
        uint8_t* my = stage(rank, h);
        if (first) hdr->slots[rank].desc[h] = mine;
        switch (c.kind) {
            case kAllReduce: case kReduce: case kAllGather:
                std::memcpy(my, c.send + off * esz, n * esz);
                break;
            case kReduceScatter:
                for (int d = 0; d < nranks; d++)
                    std::memcpy(my + (size_t)d * per * esz, c.send + ((size_t)d * c.count + off) * esz,
                                n * esz);
                break;
            case kBroadcast:
                if (rank == c.root) std::memcpy(my, c.send + off * esz, n * esz);
                break;
        }
        ncclResult_t r = barrier(what);
        if (r != ncclSuccess) return r;
        if (first) {
            first = false;
            for (int k = 0; k < nranks; k++) {
                const Desc& d = hdr->slots[k].desc[h];
                if (!(d == mine)) {
                    char buf[256];
                    std::snprintf(buf, sizeof buf,
                                  "mismatched collectives: rank %d called %s(count %llu, type %u, "
                                  "op %u, root %d), rank %d %s(count %llu, type %u, op %u, root %d)",
                                  k, kind_name(d.kind), (unsigned long long)d.count, d.dtype, d.op,
                                  d.root, rank, what, (unsigned long long)mine.count, mine.dtype,
                                  mine.op, mine.root);
                    return fail(ncclInvalidUsage, buf);
                }
            }
        }
        switch (c.kind) {
            case kAllReduce:
                for (int k = 0; k < nranks; k++) srcs[k] = stage(k, h);
                reduce(srcs, nranks, c.recv + off * esz, n, c.dtype, c.op);
                break;
            case kReduce:
                if (rank == c.root) {
                    for (int k = 0; k < nranks; k++) srcs[k] = stage(k, h);
                    reduce(srcs, nranks, c.recv + off * esz, n, c.dtype, c.op);
                }
                break;
            case kReduceScatter:
                for (int k = 0; k < nranks; k++) srcs[k] = stage(k, h) + (size_t)rank * per * esz;
                reduce(srcs, nranks, c.recv + off * esz, n, c.dtype, c.op);
                break;
            case kAllGather:
                for (int k = 0; k < nranks; k++) {
                    char* dst = c.recv + ((size_t)k * c.count + off) * esz;
                    if (k == rank && dst == c.send + off * esz) continue;  // in place
                    std::memcpy(dst, stage(k, h), n * esz);
                }
                break;
            case kBroadcast:
                if (!(rank == c.root && c.send == c.recv))
                    std::memcpy(c.recv + off * esz, stage(c.root, h), n * esz);
                break;
        }
        chunks++;
    }
    return ncclSuccess;
}

std::mutex g_last_mu;
std::string g_last_error;  // ncclGetLastError's text

void set_last_error(const std::string& s) {
    std::lock_guard<std::mutex> g(g_last_mu);
    g_last_error = s;
}

}  // namespace

// The opaque handle nccl.h declares.
struct ncclComm {
    std::shared_ptr<State> st;
    std::thread init;  // non-blocking initialisation
    std::mutex mu;     // guards init
    bool blocking = true;

    void settle_init() {
        std::lock_guard<std::mutex> g(mu);
        if (init.joinable()) init.join();
    }
};

namespace {

bool tracing() { return fake_gpu::settings().trace; }

ncclResult_t usage(const char* fn, const std::string& why, ncclResult_t code) {
    std::string s = std::string(fn) + ": " + why;
    set_last_error(s);
    if (tracing()) std::fprintf(stderr, "terse fake-gpu: %s\n", s.c_str());
    return code;
}

// The bytes of `c.recv` this rank's part of the collective writes.
size_t recv_bytes_of(const Coll& c, const State& st) {
    size_t b = c.count * elt_size(c.dtype);
    if (c.kind == kAllGather) b *= (size_t)st.nranks;
    if (c.kind == kReduce && st.rank != c.root) b = 0;
    return b;
}

ncclResult_t launch(const char* fn, ncclComm_t comm, cudaStream_t stream, Coll c) {
    if (!comm) return usage(fn, "a null communicator", ncclInvalidArgument);
    size_t esz = elt_size(c.dtype);
    if (esz == 0) return usage(fn, "an unknown data type", ncclInvalidArgument);
    bool reduces = c.kind == kAllReduce || c.kind == kReduceScatter || c.kind == kReduce;
    if (reduces && !reducible(c.dtype))
        return usage(fn, "reductions over fp8 are not emulated", ncclInvalidArgument);
    if (reduces && (int)c.op >= (int)ncclNumOps)
        return usage(fn, "a custom reduction op is not emulated", ncclInvalidArgument);
    comm->settle_init();
    State& st = *comm->st;
    if ((c.kind == kBroadcast || c.kind == kReduce) && (c.root < 0 || c.root >= st.nranks))
        return usage(fn, "root out of range", ncclInvalidArgument);
    int a = st.async.load();
    if (a != ncclSuccess) return (ncclResult_t)a;
    if (tracing())
        std::fprintf(stderr, "terse fake-gpu: %s(send %p, recv %p, count %zu, type %d, op %d) rank %d\n",
                     fn, (const void*)c.send, (void*)c.recv, c.count, (int)c.dtype, (int)c.op,
                     st.rank);
    if (c.count > 0) {
        size_t send_bytes = c.count * esz, recv_bytes = recv_bytes_of(c, st);
        if (c.kind == kReduceScatter) send_bytes *= (size_t)st.nranks;
        bool uses_send = !(c.kind == kBroadcast && st.rank != c.root);
        if (uses_send) fake_gpu::check_range((uint64_t)c.send, send_bytes, fn);
        if (recv_bytes) fake_gpu::check_range((uint64_t)c.recv, recv_bytes, fn);
    }
    std::shared_ptr<State> sp = comm->st;
    fake_gpu::enqueue((fake_gpu::Stream)stream, [sp, c, recv_bytes = recv_bytes_of(c, st)]() {
        if (sp->aborting.load() || sp->async.load() != ncclSuccess) return;
        // An error is recorded for ncclCommGetAsyncError; the receive buffer then reads as
        // all-ones bytes (NaN in f32, bf16 and f16), so a caller that misses the error sees it.
        if (sp->run(c) != ncclSuccess && !sp->aborting.load() && recv_bytes)
            std::memset(c.recv, 0xff, recv_bytes);
    });
    return ncclSuccess;
}

// Abort and destroy: stop the init thread, leave the segment, free the handle.
ncclResult_t leave(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    comm->st->aborting.store(true);
    comm->settle_init();
    comm->st->detach();
    delete comm;  // the mapping goes with the last reference (queued work may hold one)
    return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    if (!uniqueId) return usage("ncclGetUniqueId", "a null id", ncclInvalidArgument);
    static std::atomic<uint64_t> counter{0};
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = 0;
    uint64_t ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    rnd ^= (ns * 0x9e3779b97f4a7c15ull) ^ (counter.fetch_add(1) << 48);
    char name[kIdNameMax + 1];
    int len = std::snprintf(name, sizeof name, "/terse-nccl-%d-%016llx-%llx", (int)getpid(),
                            (unsigned long long)rnd, (unsigned long long)ns);
    if (len <= 0 || (size_t)len > kIdNameMax) return ncclInternalError;
    std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    std::memcpy(uniqueId->internal, kIdMagic, sizeof kIdMagic);
    uint64_t staging = staging_setting();
    std::memcpy(uniqueId->internal + kIdStagingOffset, &staging, 8);
    std::memcpy(uniqueId->internal + kIdNameOffset, name, (size_t)len + 1);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
    const char* fn = "ncclCommInitRankConfig";
    if (!comm) return usage(fn, "a null communicator pointer", ncclInvalidArgument);
    *comm = nullptr;
    if (nranks < 1 || nranks > kMaxRanks)
        return usage(fn, "nranks " + std::to_string(nranks) + " outside 1.." +
                             std::to_string(kMaxRanks),
                     ncclInvalidArgument);
    if (rank < 0 || rank >= nranks)
        return usage(fn, "rank " + std::to_string(rank) + " outside 0.." +
                             std::to_string(nranks - 1),
                     ncclInvalidArgument);
    if (std::memcmp(commId.internal, kIdMagic, sizeof kIdMagic) != 0)
        return usage(fn, "not a unique id from this library's ncclGetUniqueId",
                     ncclInvalidArgument);
    bool blocking = true;
    if (config) {
        if (config->magic != NCCL_API_MAGIC ||
            config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
            return usage(fn, "a config not made with NCCL_CONFIG_INITIALIZER", ncclInvalidArgument);
        if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
            blocking = config->blocking != 0;
        } else if (const char* b = std::getenv("NCCL_COMM_BLOCKING")) {
            blocking = std::atoi(b) != 0;
        }
    }
    auto st = std::make_shared<State>();
    st->nranks = nranks;
    st->rank = rank;
    st->timeout = timeout_setting();
    std::memcpy(&st->staging_req, commId.internal + kIdStagingOffset, 8);
    st->staging_req = std::min(kMaxStaging, std::max(kMinStaging, st->staging_req)) / 64 * 64;
    char name[kIdNameMax + 1];
    std::memcpy(name, commId.internal + kIdNameOffset, kIdNameMax);
    name[kIdNameMax] = 0;
    if (name[0] != '/' || std::strchr(name + 1, '/'))
        return usage(fn, "a malformed unique id", ncclInvalidArgument);
    st->name = name;
    auto* c = new ncclComm;
    c->st = st;
    c->blocking = blocking;
    if (tracing())
        std::fprintf(stderr, "terse fake-gpu: %s(rank %d of %d, %s, %s)\n", fn, rank, nranks,
                     name, blocking ? "blocking" : "non-blocking");
    if (blocking || nranks == 1) {
        ncclResult_t r = st->join();
        if (r != ncclSuccess) {
            leave(c);
            return r;
        }
        *comm = c;
        return ncclSuccess;
    }
    c->init = std::thread([st]() { st->join(); });
    *comm = c;
    return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (!comm || !asyncError) return ncclInvalidArgument;
    ncclResult_t a = (ncclResult_t)comm->st->async.load();
    if (a != ncclInProgress) comm->settle_init();  // the init thread has ended or is ending
    *asyncError = a;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (tracing() && comm)
        std::fprintf(stderr, "terse fake-gpu: ncclCommAbort rank %d\n", comm->st->rank);
    return leave(comm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    // Collectives complete when their stream work runs: nothing is left to flush.
    comm->settle_init();
    int a = comm->st->async.load();
    return a == ncclSuccess ? ncclSuccess : (ncclResult_t)a;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return leave(comm); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->st->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->st->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    if (!comm || !device) return ncclInvalidArgument;
    *device = 0;  // the emulation has one device
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        case ncclTimeout: return "operation timed out";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t comm) {
    static thread_local std::string copy;
    if (comm) {
        std::lock_guard<std::mutex> g(comm->st->err_mu);
        if (!comm->st->last_error.empty()) {
            copy = comm->st->last_error;
            return copy.c_str();
        }
    }
    std::lock_guard<std::mutex> g(g_last_mu);
    copy = g_last_error;
    return copy.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return launch("ncclAllReduce", comm, stream,
                  Coll{kAllReduce, (const char*)sendbuff, (char*)recvbuff, count, datatype, op, 0});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return launch("ncclReduceScatter", comm, stream,
                  Coll{kReduceScatter, (const char*)sendbuff, (char*)recvbuff, recvcount, datatype,
                       op, 0});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return launch("ncclAllGather", comm, stream,
                  Coll{kAllGather, (const char*)sendbuff, (char*)recvbuff, sendcount, datatype,
                       ncclSum, 0});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return launch("ncclBroadcast", comm, stream,
                  Coll{kBroadcast, (const char*)sendbuff, (char*)recvbuff, count, datatype,
                       ncclSum, root});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
    return launch("ncclReduce", comm, stream,
                  Coll{kReduce, (const char*)sendbuff, (char*)recvbuff, count, datatype, op, root});
}

// Every rank issues its collectives in the same order from one thread, and each runs when its
// stream work runs, so a group needs no deferral.
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

}  // extern "C"
