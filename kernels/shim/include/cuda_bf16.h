// The shim stands in for the CUDA header of this name (kernels/shim/cuda_shim.h).
#pragma once
#include "../cuda_shim.h"
