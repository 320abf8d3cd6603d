// Streams and events of the emulated CUDA device (fake_gpu.h): work on one stream runs in
// order. By default it runs when it is queued; in the late mode (TERSE_FAKE_GPU_LATE=1) it waits
// until something synchronises with it (a stream or event sync, a blocking copy, a query), so
// a host read of device results that lacks its synchronisation sees stale memory.
//
// A stream in capture (cuStreamBeginCapture) records its work into a graph instead; a graph
// launch queues the recorded work as one item. The capture's own allocations belong to the
// graph, so every launch sees the same addresses, and they are released with the graph.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "fake_gpu.h"

namespace fake_gpu {
namespace {
// What a capture recorded: shared by the graph and its executable instances; the blocks the
// capture allocated are released when the last of them goes.
struct GraphData {
    std::vector<std::function<void()>> work;
    uint64_t kernels = 0;  // the recorded kernel and library launches
    std::vector<uint64_t> owned;
    ~GraphData() {
        for (uint64_t p : owned) release(p, "cuGraphDestroy (a block the capture allocated)");
    }
};

struct Capture {
    std::shared_ptr<GraphData> graph = std::make_shared<GraphData>();
    int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    std::thread::id thread = std::this_thread::get_id();
    bool invalidated = false;
};

struct StreamObj {
    std::deque<std::function<void()>> queue;
    uint64_t queued = 0, done = 0;
    bool non_blocking = false;
    std::unique_ptr<Capture> capture;  // set between cuStreamBeginCapture and cuStreamEndCapture
};

struct EventObj {
    StreamObj* stream = nullptr;
    uint64_t ticket = 0;  // complete once stream->done >= ticket
    double at_ms = 0;     // host time when its work completed
    GraphData* captured = nullptr;  // recorded inside this capture (not a point in a queue)
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

int refuse(Capture& c, const char* function);

void drain(StreamObj& s, uint64_t upto) {
    while (s.done < upto && !s.queue.empty()) {
        auto work = std::move(s.queue.front());
        s.queue.pop_front();
        work();
        s.done++;
    }
}

void push(StreamObj& s, std::function<void()> work) {
    if (s.capture) {
        // Recorded, not run; after an invalidation nothing more is recorded.
        if (!s.capture->invalidated) s.capture->graph->work.push_back(std::move(work));
        return;
    }
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
    StreamObj& s = resolve(stream);
    if (s.capture && reinterpret_cast<uintptr_t>(stream) <= 1) {
        // Here the legacy stream and the per-thread one share a queue; in CUDA work on the
        // legacy stream during a capture is an implicit synchronisation with it.
        refuse(*s.capture, "work on the legacy default stream");
        return;
    }
    push(s, std::move(work));
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
    if (s.capture) {
        // A dependency inside the capture: the recorded work is already in order.
        ev->stream = nullptr;
        ev->captured = s.capture->graph.get();
        return;
    }
    ev->captured = nullptr;
    ev->stream = &s;
    push(s, [ev] { ev->at_ms = now_ms(); });
    ev->ticket = s.queued;
}

void wait_event(Stream stream, Event e) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto* ev = static_cast<EventObj*>(e);
    StreamObj& dst = resolve(stream);
    if (dst.capture && !(ev->captured && ev->captured == dst.capture->graph.get()) && ev->stream) {
        // CUDA refuses a capture's dependency on work outside it (isolation): recorded here
        // as an invalidated capture, which cuStreamEndCapture reports.
        std::fprintf(stderr,
                     "terse fake-gpu: cuStreamWaitEvent: a capturing stream waits on an event "
                     "recorded outside its capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)\n");
        dst.capture->invalidated = true;
        return;
    }
    if (!ev->stream) return;  // never recorded, or recorded inside a capture: nothing to wait for
    StreamObj* src = ev->stream;
    uint64_t ticket = ev->ticket;
    push(dst, [src, ticket] { drain(*src, ticket); });
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

// ---- Stream capture and graphs
namespace {
int refuse(Capture& c, const char* function) {
    std::fprintf(stderr,
                 "terse fake-gpu: %s during a stream capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; "
                 "the capture is invalidated)\n",
                 function);
    c.invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// The capture of `s`, or null.
Capture* capture_of(StreamObj& s) { return s.capture.get(); }
}  // namespace

int begin_capture(Stream stream, int mode) {
    std::lock_guard<std::recursive_mutex> g(device());
    // The legacy default stream cannot capture; the per-thread one (2, candle's) can.
    auto v = reinterpret_cast<uintptr_t>(stream);
    if (v == 0 || v == 1) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    StreamObj& s = resolve(stream);
    if (s.capture) return CUDA_ERROR_ILLEGAL_STATE;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    drain(s, s.queued);  // what was queued before the capture is not part of it
    s.capture = std::make_unique<Capture>();
    s.capture->mode = mode;
    return CUDA_SUCCESS;
}

int end_capture(Stream stream, void** graph) {
    std::lock_guard<std::recursive_mutex> g(device());
    StreamObj& s = resolve(stream);
    *graph = nullptr;
    if (!s.capture) return CUDA_ERROR_ILLEGAL_STATE;
    if (s.capture->thread != std::this_thread::get_id() &&
        s.capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    std::unique_ptr<Capture> c = std::move(s.capture);
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    *graph = new std::shared_ptr<GraphData>(c->graph);
    return CUDA_SUCCESS;
}

int capture_status(Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    Capture* c = capture_of(resolve(stream));
    if (!c) return CU_STREAM_CAPTURE_STATUS_NONE;
    return c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

bool capturing(Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    return capture_of(resolve(stream)) != nullptr;
}

void count_launch(Stream stream, Counter c) {
    std::lock_guard<std::recursive_mutex> g(device());
    Capture* cap = capture_of(resolve(stream));
    if (!cap) count(c);
    else if (!cap->invalidated) cap->graph->kernels++;
}

int refuse_on_capturing(Stream stream, const char* function) {
    std::lock_guard<std::recursive_mutex> g(device());
    Capture* c = capture_of(resolve(stream));
    return c ? refuse(*c, function) : 0;
}

int refuse_while_capturing(const char* function) {
    std::lock_guard<std::recursive_mutex> g(device());
    auto disturbs = [](StreamObj& s) {
        Capture* c = capture_of(s);
        return c && (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
                     (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                      c->thread == std::this_thread::get_id()));
    };
    if (disturbs(default_stream())) return refuse(*default_stream().capture, function);
    for (auto* s : streams())
        if (disturbs(*s)) return refuse(*s->capture, function);
    return 0;
}

void capture_alloc(Stream stream, uint64_t ptr) {
    std::lock_guard<std::recursive_mutex> g(device());
    if (Capture* c = capture_of(resolve(stream))) c->graph->owned.push_back(ptr);
}

int capture_free(Stream stream, uint64_t ptr) {
    std::lock_guard<std::recursive_mutex> g(device());
    Capture* c = capture_of(resolve(stream));
    if (!c) return 0;
    for (uint64_t p : c->graph->owned)
        if (p == ptr) return 0;  // the graph's: released with it
    return refuse(*c, "cuMemFreeAsync of a block allocated outside the capture");
}

void* instantiate_graph(void* graph) {
    auto* gd = static_cast<std::shared_ptr<GraphData>*>(graph);
    return new std::shared_ptr<GraphData>(*gd);
}

int launch_graph(void* exec, Stream stream) {
    std::lock_guard<std::recursive_mutex> g(device());
    StreamObj& s = resolve(stream);
    if (s.capture) return refuse(*s.capture, "cuGraphLaunch");
    auto data = *static_cast<std::shared_ptr<GraphData>*>(exec);
    count(kGraphKernels, data->kernels);
    push(s, [data] {
        for (auto& w : data->work) w();
    });
    return CUDA_SUCCESS;
}

void destroy_graph(void* graph) {
    std::lock_guard<std::recursive_mutex> g(device());
    delete static_cast<std::shared_ptr<GraphData>*>(graph);
}

void destroy_graph_exec(void* exec) {
    std::lock_guard<std::recursive_mutex> g(device());
    // Work already queued holds its own reference: the blocks outlive a queued launch.
    delete static_cast<std::shared_ptr<GraphData>*>(exec);
}
}  // namespace fake_gpu
