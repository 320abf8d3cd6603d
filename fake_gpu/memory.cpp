// Device memory of the emulated CUDA device (fake_gpu.h): host blocks with guard zones, filled
// at allocation with all-ones bytes (NaN in f32, bf16 and f16) so a read of memory nobody wrote
// shows up as a wrong result, poisoned and quarantined when freed so a use after free shows up
// too; every copy and every launch's pointers are checked against the live blocks.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "fake_gpu.h"

namespace fake_gpu {
namespace {
// cudaMalloc's alignment; the guard zones keep it.
constexpr size_t kAlign = 256;
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned char kFreshByte = 0xFF;  // 0xFFFF.. is a NaN in f32, bf16 and f16
// Freed blocks stay mapped (poisoned) until this many bytes are in quarantine.
constexpr size_t kQuarantineBytes = size_t(1) << 30;

struct Block {
    size_t bytes;
    size_t padded;  // the usable size rounded up to kAlign
    void* base;     // what aligned_alloc returned: guard, block, guard
};

struct Heap {
    std::mutex mu;
    std::map<uint64_t, Block> live;
    std::map<uint64_t, Block> quarantined;
    std::deque<uint64_t> order;  // quarantine, oldest first
    size_t quarantine_bytes = 0;
    size_t used = 0;
};

Heap& heap() {
    static Heap* h = new Heap;  // never destroyed: frees may come from static destructors
    return *h;
}

std::string hex(uint64_t p) {
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", (unsigned long long)p);
    return b;
}

// The guard zones of `b` at `start` must still hold the pattern.
void check_guards(uint64_t start, const Block& b, const char* when) {
    auto* lo = static_cast<const unsigned char*>(b.base);
    const unsigned char* hi = reinterpret_cast<const unsigned char*>(start) + b.padded;
    for (size_t i = 0; i < kGuard; i++) {
        if (lo[i] != kGuardByte)
            die(std::string("a write before the start of the ") + std::to_string(b.bytes) +
                "-byte block at " + hex(start) + " (found " + when + ")");
        if (hi[i] != kGuardByte)
            die(std::string("a write past the end of the ") + std::to_string(b.bytes) +
                "-byte block at " + hex(start) + " (found " + when + ")");
    }
}

// The live block holding `ptr`, or null.
const std::pair<const uint64_t, Block>* find(Heap& h, uint64_t ptr) {
    auto it = h.live.upper_bound(ptr);
    if (it == h.live.begin()) return nullptr;
    --it;
    if (ptr < it->first + it->second.bytes || (ptr == it->first && it->second.bytes == 0))
        return &*it;
    return nullptr;
}

bool in_quarantine(Heap& h, uint64_t ptr) {
    auto it = h.quarantined.upper_bound(ptr);
    if (it == h.quarantined.begin()) return false;
    --it;
    return ptr < it->first + it->second.padded;
}
}  // namespace

uint64_t alloc(size_t bytes) {
    size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (padded == 0) padded = kAlign;
    void* base = std::aligned_alloc(kAlign, padded + 2 * kGuard);
    if (!base) return 0;
    auto* p = static_cast<unsigned char*>(base);
    std::memset(p, kGuardByte, kGuard);
    std::memset(p + kGuard, settings().zero_fill ? 0 : kFreshByte, padded);
    std::memset(p + kGuard + padded, kGuardByte, kGuard);
    uint64_t start = reinterpret_cast<uint64_t>(p + kGuard);
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    h.live[start] = Block{bytes, padded, base};
    h.used += padded;
    count(kAllocBytes, bytes);
    return start;
}

size_t release(uint64_t ptr, const char* function) {
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    auto it = h.live.find(ptr);
    if (it == h.live.end()) {
        if (in_quarantine(h, ptr))
            die(std::string(function) + "(" + hex(ptr) + "): a block freed twice");
        die(std::string(function) + "(" + hex(ptr) + "): not the start of a live block");
    }
    Block b = it->second;
    check_guards(ptr, b, (std::string("at ") + function).c_str());
    h.live.erase(it);
    h.used -= b.padded;
    std::memset(reinterpret_cast<void*>(ptr), kFreshByte, b.padded);
    h.quarantined[ptr] = b;
    h.order.push_back(ptr);
    h.quarantine_bytes += b.padded;
    while (h.quarantine_bytes > kQuarantineBytes && !h.order.empty()) {
        uint64_t old = h.order.front();
        h.order.pop_front();
        auto q = h.quarantined.find(old);
        h.quarantine_bytes -= q->second.padded;
        std::free(q->second.base);
        h.quarantined.erase(q);
    }
    return b.bytes;
}

void check_range(uint64_t ptr, size_t bytes, const char* function) {
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    const auto* b = find(h, ptr);
    if (!b) {
        if (in_quarantine(h, ptr))
            die(std::string(function) + ": " + hex(ptr) + " lies in a freed block (use after free)");
        die(std::string(function) + ": " + hex(ptr) + " is not device memory");
    }
    uint64_t end = b->first + b->second.bytes;
    if (bytes > end - ptr)
        die(std::string(function) + ": " + std::to_string(bytes) + " bytes at " + hex(ptr) +
            " run " + std::to_string(bytes - (end - ptr)) + " bytes past the end of its " +
            std::to_string(b->second.bytes) + "-byte block");
}

bool is_device(uint64_t ptr) {
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    return find(h, ptr) != nullptr;
}

void check_guards_of(uint64_t ptr, const char* when) {
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    if (const auto* b = find(h, ptr)) check_guards(b->first, b->second, when);
}

size_t used_bytes() {
    Heap& h = heap();
    std::lock_guard<std::mutex> g(h.mu);
    return h.used;
}

namespace {
struct Pool {
    std::mutex mu;
    uint64_t threshold = 0;  // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD's default
    uint64_t held = 0;       // bytes freed into the pool, kept since its last hand-back
    uint64_t used = 0;       // bytes of live cuMemAllocAsync blocks
};
Pool& pool() {
    static Pool* p = new Pool;  // never destroyed, like the heap
    return *p;
}
}  // namespace

void pool_allocated(size_t bytes) {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    p.used += bytes;
    p.held -= std::min<uint64_t>(p.held, bytes);  // reused before the OS is asked
}

void pool_freed(size_t bytes) {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    p.used -= std::min<uint64_t>(p.used, bytes);
    p.held += bytes;
}

uint64_t pool_held() {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    return p.held;
}

uint64_t pool_used() {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    return p.used;
}

void pool_synchronised() {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    if (p.held > p.threshold) {
        p.held = p.threshold;  // a driver trims the pool down to the threshold
        count(kPoolReleases);
    }
}

void set_pool_threshold(uint64_t bytes) {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    p.threshold = bytes;
}

uint64_t pool_threshold() {
    Pool& p = pool();
    std::lock_guard<std::mutex> g(p.mu);
    return p.threshold;
}
}  // namespace fake_gpu
