// The emulated CUDA device's stand-in for CUDA's <cuda_fp8.h> in the kernels' CPU builds
// (xtask/src/fake_gpu/kernels/): everything is in terse_fake_cuda.h, forced into each module.
#pragma once
#include "terse_fake_cuda.h"
