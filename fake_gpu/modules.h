// Modules, functions and launches of the emulated device (modules.cpp), for driver.cpp.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "fake_gpu.h"

namespace fake_gpu {
struct Module;
struct Function {
    std::string name;
    Module* module = nullptr;
    void (*body)(void**) = nullptr;  // null: no CPU build (launching it is an error)
    std::vector<size_t> param_sizes;
    unsigned max_dynamic_shared = 48 * 1024;  // raised by cuFuncSetAttribute
};
struct Module {
    std::string library;
    std::map<std::string, Function> functions;
};
Module* load_module(const void* image);
void launch(Function* f, const unsigned grid[3], const unsigned block[3], unsigned shared,
            Stream stream, void** params);
}  // namespace fake_gpu
