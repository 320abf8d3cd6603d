// nccl_test.cpp's scenarios of failing ranks and communicator lifetimes (included by it alone):
// a dead, stuck or never-joining rank, an abort during initialisation, mismatched counts, world
// size 1, two communicators, back-to-back collectives and teardown races.
#pragma once

#include "harness.h"

namespace {

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

}  // namespace
