// Waits of the emulated NCCL (fake_gpu/nccl/, internal.h): how a rank waits for its peers (at
// initialisation in segment.cpp, at every barrier of a collective in collectives.cpp) on the
// segment's futex words, under a deadline, and how a failure is recorded and propagated.
//
// A rank that leaves (abort, destroy, an error) marks its slot; the others' waits see that, a
// peer process that died (or is a zombie), or the deadline, and the communicator records
// ncclRemoteError for ncclCommGetAsyncError instead of hanging.
//
// TERSE_FAKE_GPU_NCCL_TIMEOUT_S (seconds, may be fractional; default 1800, the default of the
// launcher's --timeout, because rank 0 may evaluate for minutes while its peers wait in a
// collective) bounds every wait for a live peer: a collective's stream work runs on the caller's
// thread, so terse's own deadline cannot fire before this one. A peer that exits or leaves is
// noticed within about 0.1 s whatever the timeout.
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake_gpu.h"
#include "internal.h"

namespace fake_nccl {

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

// Records the communicator's first error (what ncclCommGetAsyncError reports), says why on
// stderr, and tells the peers this rank failed and is gone so they fail fast instead of
// timing out (or completing a barrier this rank arrived at but gave up on).
ncclResult_t State::fail(ncclResult_t code, const std::string& why) {
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

void State::mark_gone() {
    if (hdr && attached) {
        hdr->slots[rank].gone.store(1, std::memory_order_release);
        futex_wake(&hdr->joined);
        futex_wake(&hdr->arrivals);
    }
}

// Waits until *w reaches target (wrap-safe), a peer is gone or dead, this rank aborts, or the
// deadline passes.
ncclResult_t State::wait_for(std::atomic<uint32_t>* w, uint32_t target,
                             const char* what) {
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

ncclResult_t State::barrier(const char* what) {
    barriers++;
    uint32_t target = barriers * (uint32_t)nranks;
    uint32_t v = hdr->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (v == target) futex_wake(&hdr->arrivals);
    return wait_for(&hdr->arrivals, target, what);
}

}  // namespace fake_nccl
