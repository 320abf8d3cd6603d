// The private interface of terse's emulated NCCL (libnccl.so.2, the files of fake_gpu/nccl/):
// communicators between rank processes on one machine over a POSIX shared-memory segment named in
// the unique id; collectives reduce in rank order, so every rank gets the same bits, and no wait
// is unbounded. The exported C API (api.cpp) makes a State per rank, which joins the segment
// (segment.cpp), waits for its peers under a deadline and propagates failures (waits.cpp), and
// runs collectives chunk by chunk through the staging areas (collectives.cpp) with the
// reductions of every element type (reduce.cpp).
#pragma once
#include <nccl.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

// Hidden: shared by the files of libnccl.so.2, exported by none of them.
namespace fake_nccl __attribute__((visibility("hidden"))) {

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
// The collective's NCCL function name (for messages).
const char* kind_name(uint32_t k);

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
    Desc desc[2];                // per staging half (see collectives.cpp)
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

// ---- Settings (read from the environment; each dies on a malformed value).
// TERSE_FAKE_GPU_NCCL_STAGING, the staging bytes per rank, for ncclGetUniqueId (segment.cpp).
uint64_t staging_setting();
// TERSE_FAKE_GPU_NCCL_TIMEOUT_S, for ncclCommInitRankConfig (waits.cpp).
double timeout_setting();

// ---- Time and the futex words peers wait on (waits.cpp).
double now_s();
void futex_wait(std::atomic<uint32_t>* w, uint32_t seen, double seconds);
void futex_wake(std::atomic<uint32_t>* w);
// A peer process that exited: gone, or a zombie its parent has not reaped yet.
bool process_gone(pid_t pid);

// ---- Element types and reductions (reduce.cpp).
// Bytes of one element; 0 for a type this library does not know.
size_t elt_size(ncclDataType_t t);
// Types a reduction takes (not fp8).
bool reducible(ncclDataType_t t);
// dst[i] = srcs[0][i] op srcs[1][i] op ... (rank order), for i < count; f16 and bf16 are reduced
// in f32 and rounded once; integer sums and products wrap.
void reduce(const void* const* srcs, int n, void* dst, size_t count, ncclDataType_t t,
            ncclRedOp_t op);

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

    ~State();  // segment.cpp

    std::string who() const {
        return "NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks);
    }

    // ---- Failures and waits (waits.cpp).
    // Records the communicator's first error (what ncclCommGetAsyncError reports), says why on
    // stderr, and tells the peers this rank failed and is gone so they fail fast instead of
    // timing out (or completing a barrier this rank arrived at but gave up on).
    ncclResult_t fail(ncclResult_t code, const std::string& why);
    void mark_gone();
    // Waits until *w reaches target (wrap-safe), a peer is gone or dead, this rank aborts, or the
    // deadline passes.
    ncclResult_t wait_for(std::atomic<uint32_t>* w, uint32_t target, const char* what);
    ncclResult_t barrier(const char* what);

    // ---- The segment (segment.cpp).
    uint8_t* stage(int k, uint64_t half) const {
        uint64_t h = hdr->staging / 2;
        return static_cast<uint8_t*>(base) + kHeaderBytes + (uint64_t)k * hdr->staging + half * h;
    }
    // Opens (or creates) the segment, claims this rank's slot, waits for every rank.
    ncclResult_t join();
    void unlink_name();
    // Before the header exists (the creator failed to size or map it).
    void unlink_name_unmapped();
    // Leaves the communicator (abort or destroy): peers see the slot gone; the name goes.
    void detach();

    // ---- Collectives (collectives.cpp).
    ncclResult_t run(const Coll& c);
    ncclResult_t run_local(const Coll& c);
};

// ---- The API's diagnostics (api.cpp).
bool tracing();
// Records `fn: why` for ncclGetLastError (and traces it); returns `code`.
ncclResult_t usage(const char* fn, const std::string& why, ncclResult_t code);

// Checks a collective's arguments and enqueues it on `stream` (collectives.cpp).
ncclResult_t launch(const char* fn, ncclComm_t comm, cudaStream_t stream, Coll c);

}  // namespace fake_nccl

// The opaque handle nccl.h declares (hidden, as the State it holds).
struct __attribute__((visibility("hidden"))) ncclComm {
    std::shared_ptr<fake_nccl::State> st;
    std::thread init;  // non-blocking initialisation
    std::mutex mu;     // guards init
    bool blocking = true;

    void settle_init() {
        std::lock_guard<std::mutex> g(mu);
        if (init.joinable()) init.join();
    }
};
