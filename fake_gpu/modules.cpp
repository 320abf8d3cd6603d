// Modules and launches of the emulated CUDA device: cuModuleLoadData's PTX is read for its
// `.entry` names and each entry's parameter sizes; each name resolves to the CPU build of the
// same .cu source (a libterse_fake_<module>.so in TERSE_FAKE_GPU_KERNELS, written by
// `cargo xtask fake-gpu`), and a launch runs it through the SIMT runtime (fake_gpu/fibers/) on the
// launch's stream, with grid, block, dynamic shared memory and parameters exactly as given.
#include "modules.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace fake_gpu {
namespace {
// Every kernel library in the kernels directory, loaded once.
struct Library {
    std::string module;  // libterse_fake_<module>.so
    std::map<std::string, void (*)(void**)> kernels;
};

std::vector<Library>& libraries() {
    static auto* libs = [] {
        auto* libs = new std::vector<Library>;
        const std::string& dir = settings().kernels;
        if (dir.empty())
            die("TERSE_FAKE_GPU_KERNELS is not set: run the binary through `cargo xtask fake-gpu`");
        DIR* d = opendir(dir.c_str());
        if (!d) die("TERSE_FAKE_GPU_KERNELS=" + dir + ": not a directory");
        std::vector<std::string> names;
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            if (n.rfind("libterse_fake_", 0) == 0 && n.size() > 17 &&
                n.compare(n.size() - 3, 3, ".so") == 0)
                names.push_back(n);
        }
        closedir(d);
        std::sort(names.begin(), names.end());
        for (auto& n : names) {
            std::string path = dir + "/" + n;
            void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
            if (!h) die(std::string("loading ") + path + ": " + dlerror());
            auto table = reinterpret_cast<terse_fake_kernels_fn>(dlsym(h, "terse_fake_kernels"));
            if (!table) die(path + " has no terse_fake_kernels table");
            Library lib;
            lib.module = n.substr(14, n.size() - 17);
            size_t count = 0;
            const terse_fake_kernel* k = table(&count);
            for (size_t i = 0; i < count; i++) lib.kernels[k[i].name] = k[i].body;
            libs->push_back(std::move(lib));
        }
        if (libs->empty()) die("TERSE_FAKE_GPU_KERNELS=" + dir + " holds no kernel libraries");
        return libs;
    }();
    return *libs;
}

// The byte size of one `.param` declaration (".param .u64 x", ".param .align 8 .b8 x[16]").
size_t param_size(const std::string& decl) {
    size_t bytes = 0;
    static const std::pair<const char*, size_t> kinds[] = {
        {".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4},
        {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2},
        {".u8", 1},  {".s8", 1},  {".b8", 1}};
    for (auto& [k, n] : kinds) {
        size_t at = decl.find(k);
        size_t after = at + strlen(k);
        if (at != std::string::npos &&
            (after == decl.size() || decl[after] == ' ' || decl[after] == '[')) {
            bytes = n;
            break;
        }
    }
    if (!bytes) die("a PTX parameter of unknown type: " + decl);
    size_t open = decl.find('[');
    if (open != std::string::npos) bytes *= std::stoul(decl.substr(open + 1));
    return bytes;
}

// Every `.entry` of a PTX text with its parameters' sizes.
std::vector<std::pair<std::string, std::vector<size_t>>> entries(const std::string& ptx) {
    std::vector<std::pair<std::string, std::vector<size_t>>> out;
    size_t at = 0;
    while ((at = ptx.find(".entry ", at)) != std::string::npos) {
        size_t name_at = at + 7;
        size_t open = ptx.find('(', name_at);
        size_t close = ptx.find(')', name_at);
        if (open == std::string::npos || close == std::string::npos) die("a PTX .entry without parameters");
        std::string name = ptx.substr(name_at, open - name_at);
        name.erase(std::remove_if(name.begin(), name.end(), ::isspace), name.end());
        std::vector<size_t> sizes;
        std::string list = ptx.substr(open + 1, close - open - 1);
        size_t p = 0;
        while ((p = list.find(".param", p)) != std::string::npos) {
            size_t end = list.find(',', p);
            std::string decl = list.substr(p, end == std::string::npos ? std::string::npos : end - p);
            // Drop the parameter's name: keep ".param [.align N] .type" and any "[n]".
            std::string kept;
            size_t last_space = decl.find_last_of(' ');
            std::string tail = decl.substr(last_space + 1);
            kept = decl.substr(0, last_space);
            size_t bracket = tail.find('[');
            if (bracket != std::string::npos) kept += tail.substr(bracket);
            sizes.push_back(param_size(kept));
            p = end == std::string::npos ? list.size() : end;
        }
        out.emplace_back(name, sizes);
        at = close;
    }
    return out;
}
}  // namespace

Module* load_module(const void* image) {
    const char* text = static_cast<const char*>(image);
    if (std::memcmp(text, "\x7f" "ELF", 4) == 0 || *reinterpret_cast<const uint32_t*>(text) == 0xba55ed50u)
        die("cuModuleLoadData was given a cubin or fatbin; the emulation runs PTX modules only");
    std::string ptx(text);
    auto found = entries(ptx);
    if (found.empty()) die("cuModuleLoadData: a PTX module without .entry");
    // The library holding most of the entries is the module's CPU build.
    const Library* best = nullptr;
    size_t best_hits = 0;
    for (auto& lib : libraries()) {
        size_t hits = 0;
        for (auto& [name, _] : found) hits += lib.kernels.count(name);
        if (hits > best_hits) best = &lib, best_hits = hits;
    }
    auto* m = new Module;
    m->library = best ? best->module : "(none)";
    for (auto& [name, sizes] : found) {
        Function f;
        f.name = name;
        f.module = m;
        f.param_sizes = sizes;
        if (best) {
            auto it = best->kernels.find(name);
            if (it != best->kernels.end()) f.body = it->second;
        }
        m->functions.emplace(name, std::move(f));
    }
    if (settings().trace)
        std::fprintf(stderr, "terse fake-gpu: module %s: %zu entries, %zu with a CPU build\n",
                     m->library.c_str(), found.size(), best_hits);
    return m;
}

void launch(Function* f, const unsigned grid[3], const unsigned block[3], unsigned shared,
            Stream stream, void** params) {
    if (!f->body)
        die("kernel " + f->name + " (module " + f->module->library + ") has no CPU build");
    if (shared > f->max_dynamic_shared)
        die("kernel " + f->name + ": " + std::to_string(shared) +
            " bytes of dynamic shared memory, over its limit of " +
            std::to_string(f->max_dynamic_shared) +
            " (above 48 KB needs cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES))");
    // The parameters are copied now: the caller's storage may be gone when the work runs.
    std::vector<std::vector<unsigned char>> values;
    for (size_t i = 0; i < f->param_sizes.size(); i++) {
        auto* p = static_cast<const unsigned char*>(params[i]);
        values.emplace_back(p, p + f->param_sizes[i]);
    }
    std::array<unsigned, 3> g{grid[0], grid[1], grid[2]}, b{block[0], block[1], block[2]};
    if (settings().trace)
        std::fprintf(stderr, "terse fake-gpu: launch %s grid (%u,%u,%u) block (%u,%u,%u) shared %u\n",
                     f->name.c_str(), g[0], g[1], g[2], b[0], b[1], b[2], shared);
    std::string name = f->name;
    auto body = f->body;
    enqueue(stream, [name, body, g, b, shared, values = std::move(values)]() mutable {
        std::vector<void*> ptrs;
        for (auto& v : values) ptrs.push_back(v.data());
        char err[1024];
        if (terse_fake_run(name.c_str(), g.data(), b.data(), shared, body, ptrs.data(), err,
                           sizeof err))
            die(err);
        // A kernel that wrote past a buffer it was given shows up in that buffer's guards.
        for (auto& v : values)
            if (v.size() == 8) {
                uint64_t p;
                std::memcpy(&p, v.data(), 8);
                if (is_device(p)) check_guards_of(p, ("after kernel " + name).c_str());
            }
    });
}
}  // namespace fake_gpu
