// Streams and events of the emulated CUDA device (fake_gpu.h): work on one stream runs in
// order. By default it runs when it is queued; in the late mode (TERSE_FAKE_GPU_LATE=1) it waits
// until something synchronises with it (a stream or event sync, a blocking copy, a query), so
// a host read of device results that lacks its synchronisation sees stale memory.
#include <chrono>
#include <deque>
#include <mutex>
#include <set>

#include "fake_gpu.h"

namespace fake_gpu {
namespace {
struct StreamObj {
    std::deque<std::function<void()>> queue;
    uint64_t queued = 0, done = 0;
    bool non_blocking = false;
};

struct EventObj {
    StreamObj* stream = nullptr;
    uint64_t ticket = 0;  // complete once stream->done >= ticket
    double at_ms = 0;     // host time when its work completed
};

// One lock for the whole device: work items may drain other streams (event waits), so it is
// recursive; launches are serialised anyway (`__shared__` statics are per block).
std::recursive_mutex& device() {
    static auto* m = new std::recursive_mutex;
    return *m;
}

StreamObj& default_stream() {
    static auto* s = new StreamObj;
    return *s;
}

std::set<StreamObj*>& streams() {
    static auto* s = new std::set<StreamObj*>;
    return *s;
}

StreamObj& resolve(Stream s) {
    auto v = reinterpret_cast<uintptr_t>(s);
    // 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the default stream here.
    if (v <= 2) return default_stream();
    auto* obj = static_cast<StreamObj*>(s);
    if (!streams().count(obj)) die("a stream handle that was never created or was destroyed");
    return *obj;
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void drain(StreamObj& s, uint64_t upto) {
    while (s.done < upto && !s.queue.empty()) {
        auto work = std::move(s.queue.front());
        s.queue.pop_front();
        work();
        s.done++;
    }
}

void push(StreamObj& s, std::function<void()> work) {
    s.queued++;
    if (settings().late) {
        s.queue.push_back(std::move(work));
    } else {
        work();
        s.done++;
    }
}
}  // namespace

void enqueue(Stream stream, std::function<void()> work) {
    std::lock_guard<std::recursive_mutex> g(device());
    push(resolve(stream), std::move(work));
}

void sync_stream(Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    StreamObj& s = resolve(stream);
    drain(s, s.queued);
}

void sync_all() {
    std::lock_guard<std::recursive_mutex> g(device());
    drain(default_stream(), default_stream().queued);
    for (auto* s : streams()) drain(*s, s->queued);
}

void sync_blocking() {
    std::lock_guard<std::recursive_mutex> g(device());
    drain(default_stream(), default_stream().queued);
    for (auto* s : streams())
        if (!s->non_blocking) drain(*s, s->queued);
}

bool query_stream(Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    StreamObj& s = resolve(stream);
    bool ready = s.done >= s.queued;
    drain(s, s.queued);  // complete it now, so a polling loop makes progress
    return ready;
}

Stream create_stream(bool non_blocking) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* s = new StreamObj;
    s->non_blocking = non_blocking;
    streams().insert(s);
    return s;
}

void destroy_stream(Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    StreamObj& s = resolve(stream);
    drain(s, s.queued);  // cuStreamDestroy lets queued work finish
    if (&s != &default_stream()) {
        streams().erase(&s);
        delete &s;
    }
}

Event create_event() { return new EventObj; }

void destroy_event(Event e) {
    std::lock_guard<std::recursive_mutex> g(device());
    delete static_cast<EventObj*>(e);
}

void record_event(Event e, Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* ev = static_cast<EventObj*>(e);
    StreamObj& s = resolve(stream);
    ev->stream = &s;
    push(s, [ev] { ev->at_ms = now_ms(); });
    ev->ticket = s.queued;
}

void wait_event(Stream stream, Event e) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* ev = static_cast<EventObj*>(e);
    if (!ev->stream) return;  // never recorded: nothing to wait for
    StreamObj* src = ev->stream;
    uint64_t ticket = ev->ticket;
    push(resolve(stream), [src, ticket] { drain(*src, ticket); });
}

void sync_event(Event e) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* ev = static_cast<EventObj*>(e);
    if (ev->stream) drain(*ev->stream, ev->ticket);
}

bool query_event(Event e) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* ev = static_cast<EventObj*>(e);
    if (!ev->stream) return true;
    bool ready = ev->stream->done >= ev->ticket;
    drain(*ev->stream, ev->ticket);
    return ready;
}

float elapsed_ms(Event start, Event end) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto *a = static_cast<EventObj*>(start), *b = static_cast<EventObj*>(end);
    return (float)(b->at_ms - a->at_ms);
}
}  // namespace fake_gpu
