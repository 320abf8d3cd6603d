// The shim stands in for CUDA's <mma.h>: nvcuda::wmma emulated in kernels/shim/wmma.h.
#pragma once
#include "../cuda_shim.h"
#include "../wmma.h"
