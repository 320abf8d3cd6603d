// Collectives of the emulated NCCL (fake_gpu/nccl/, internal.h): the API's entry points (api.cpp)
// check their arguments and enqueue one on the caller's stream (launch); when the stream work
// runs, State::run moves the buffers through the segment's staging areas (segment.cpp) chunk by
// chunk, meeting the peers at a barrier per chunk (waits.cpp) and reducing in rank order
// (reduce.cpp).
//
// Each rank has a staging area in the segment, split in two halves used alternately by successive
// chunks. A collective moves its buffers through the staging areas chunk by chunk: each rank
// copies its chunk into its own area, all ranks meet at a barrier, each rank reads every area in
// rank order into its receive buffer. Two halves mean one barrier per chunk: a rank refills half h
// only after the next chunk's barrier, which no rank reaches before it has finished reading half h.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "fake_gpu.h"
#include "internal.h"

namespace fake_nccl {

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

namespace {

// The bytes of `c.recv` this rank's part of the collective writes.
size_t recv_bytes_of(const Coll& c, const State& st) {
    size_t b = c.count * elt_size(c.dtype);
    if (c.kind == kAllGather) b *= (size_t)st.nranks;
    if (c.kind == kReduce && st.rank != c.root) b = 0;
    return b;
}

}  // namespace

ncclResult_t launch(const char* fn, ncclComm_t comm, cudaStream_t stream, Coll c) {
    fake_gpu::ApiScope scope(fake_gpu::Api::Library);  // counted once, whichever entry point
    if (fake_gpu::sticky_error()) return ncclUnhandledCudaError;  // faults.cpp: a sticky fault
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
    fake_gpu::count(fake_gpu::kLibraryLaunches);
    fake_gpu::enqueue((fake_gpu::Stream)stream, [sp, c, recv_bytes = recv_bytes_of(c, st)]() {
        if (sp->aborting.load() || sp->async.load() != ncclSuccess) return;
        // An error is recorded for ncclCommGetAsyncError; the receive buffer then reads as
        // all-ones bytes (NaN in f32, bf16 and f16), so a caller that misses the error sees it.
        if (sp->run(c) != ncclSuccess && !sp->aborting.load() && recv_bytes)
            std::memset(c.recv, 0xff, recv_bytes);
    });
    return ncclSuccess;
}

}  // namespace fake_nccl
