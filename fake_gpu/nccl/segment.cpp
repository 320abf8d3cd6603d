// The shared-memory segment of the emulated NCCL (fake_gpu/nccl/, internal.h): how a rank's State
// joins its communicator's segment (the name from ncclGetUniqueId, joined by ncclCommInitRank),
// and how it leaves it; collectives.cpp then moves data through the segment's staging areas.
//
// Layout of a communicator's segment (/dev/shm/<name from the id>): a Header (sizes, a join
// counter, a barrier counter, one Slot per rank), then one staging area per rank, split in two
// halves used alternately by successive chunks (collectives.cpp).
//
// Joining: whoever opens the name first (O_CREAT|O_EXCL) sizes it (posix_fallocate, so a full
// /dev/shm is an error, never a SIGBUS later; the staging shrinks to fit) and writes the header
// last; the others wait for the header. The last rank to join unlinks the name: the mapping stays,
// and a crash later leaks nothing. A rank that leaves (abort, destroy, an error) marks its slot,
// which its peers' waits see (waits.cpp).
//
// TERSE_FAKE_GPU_NCCL_STAGING (bytes, K/M/G suffix allowed, default 16M, at least 4K) is the
// staging per rank, read by ncclGetUniqueId and carried in the id.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake_gpu.h"
#include "internal.h"

namespace fake_nccl {

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

State::~State() {
    if (base) munmap(base, size);
    if (fd >= 0) close(fd);
}

// Opens (or creates) the segment, claims this rank's slot, waits for every rank.
ncclResult_t State::join() {
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

void State::unlink_name() {
    if (hdr && hdr->unlinked.exchange(1) == 0) shm_unlink(name.c_str());
}

// Before the header exists (the creator failed to size or map it).
void State::unlink_name_unmapped() { shm_unlink(name.c_str()); }

// Leaves the communicator (abort or destroy): peers see the slot gone; the name goes.
void State::detach() {
    if (left) return;
    left = true;
    if (hdr && attached) mark_gone();
    if (hdr) unlink_name();
    else if (fd >= 0) shm_unlink(name.c_str());  // created or opened, never mapped
}

ncclResult_t run(const Coll& c);

}  // namespace fake_nccl
