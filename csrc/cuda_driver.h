// cuda_driver.h -- the CUDA driver API, loaded with dlopen on first use.
//
// The runtime must import on machines without a GPU or driver, so it never
// links libcuda: only the functions below are looked up, once, from
// libcuda.so.1. Types are declared here as the driver declares them.
#pragma once

#include <string>

namespace xlakern {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;

constexpr CUresult kCudaSuccess = 0;
constexpr int kFuncAttributeMaxDynamicSharedSizeBytes = 8;

struct CudaDriver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);  // status 1: capture active

  // "name failed: CUDA_ERROR_... (text)".
  std::string describe(const char* call, CUresult rc) const;
};

// The loaded driver; throws std::runtime_error (saying what is missing) when
// libcuda.so.1 or one of the functions cannot be found.
const CudaDriver& cuda_driver();

}  // namespace xlakern
