// The exported C API of terse's emulated NCCL (libnccl.so.2; fake_gpu/nccl/, internal.h): unique
// ids, communicators (their State joins the shared-memory segment, segment.cpp), their errors,
// and the collectives' entry points, each enqueued on the caller's stream (collectives.cpp).
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fake_gpu.h"
#include "internal.h"

using namespace fake_nccl;

namespace {

std::mutex g_last_mu;
std::string g_last_error;  // ncclGetLastError's text

void set_last_error(const std::string& s) {
    std::lock_guard<std::mutex> g(g_last_mu);
    g_last_error = s;
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

namespace fake_nccl {

bool tracing() { return fake_gpu::settings().trace; }

ncclResult_t usage(const char* fn, const std::string& why, ncclResult_t code) {
    std::string s = std::string(fn) + ": " + why;
    set_last_error(s);
    if (tracing()) std::fprintf(stderr, "terse fake-gpu: %s\n", s.c_str());
    return code;
}

}  // namespace fake_nccl

// ncclComm is hidden (internal.h), which would hide every function that takes one: the API is
// exported explicitly.
#pragma GCC visibility push(default)
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
#pragma GCC visibility pop
