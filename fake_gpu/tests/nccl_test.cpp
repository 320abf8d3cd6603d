// Tests of the emulated NCCL (fake_gpu/nccl/): ranks are fork()ed processes, as under
// `cargo xtask train --nproc N`; prints one line per failure and exits nonzero on any.
// `cargo xtask fake-gpu --self-test` builds and runs it against target/fake-gpu/lib.
// The scenarios are in nccl/ (harness.h, collectives.h, faults.h); this file forks the ranks,
// runs each scenario and checks what they leave behind.
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

#include "nccl/collectives.h"
#include "nccl/faults.h"
#include "nccl/harness.h"

namespace {

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
