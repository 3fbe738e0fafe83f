#include "cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

namespace xlakern {

namespace {

template <typename F>
void bind(void* lib, const char* symbol, F* slot) {
  void* address = dlsym(lib, symbol);
  if (address == nullptr) {
    throw std::runtime_error(std::string("libcuda.so.1 has no ") + symbol +
                             "; the NVIDIA driver is too old for this xlakern");
  }
  *slot = reinterpret_cast<F>(address);
}

CudaDriver load() {
  // Never dlclose'd: kernels stay loaded for the life of the process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                             (why ? why : "not found") +
                             "; Numba CUDA kernels need an NVIDIA GPU and its driver");
  }
  CudaDriver d{};
  bind(lib, "cuInit", &d.cuInit);
  bind(lib, "cuGetErrorString", &d.cuGetErrorString);
  bind(lib, "cuStreamGetCtx", &d.cuStreamGetCtx);
  bind(lib, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent);
  bind(lib, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent);
  bind(lib, "cuCtxGetDevice", &d.cuCtxGetDevice);
  bind(lib, "cuModuleLoadData", &d.cuModuleLoadData);
  bind(lib, "cuModuleGetFunction", &d.cuModuleGetFunction);
  bind(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute);
  bind(lib, "cuLaunchKernel", &d.cuLaunchKernel);
  bind(lib, "cuMemsetD8Async", &d.cuMemsetD8Async);
  bind(lib, "cuStreamIsCapturing", &d.cuStreamIsCapturing);
  CUresult rc = d.cuInit(0);
  if (rc != kCudaSuccess) throw std::runtime_error(d.describe("cuInit", rc));
  return d;
}

}  // namespace

std::string CudaDriver::describe(const char* call, CUresult rc) const {
  const char* text = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(rc, &text) != kCudaSuccess) text = nullptr;
  return std::string(call) + " failed with CUDA error " + std::to_string(rc) +
         (text ? std::string(" (") + text + ")" : std::string());
}

const CudaDriver& cuda_driver() {
  // Lock-free once loaded (this runs on every launch). A failed load is
  // retried on the next call rather than cached, so the message always says
  // what is wrong now.
  static std::atomic<const CudaDriver*> loaded{nullptr};
  static std::mutex mutex;
  if (const CudaDriver* d = loaded.load(std::memory_order_acquire)) return *d;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded.load(std::memory_order_relaxed) == nullptr) {
    loaded.store(new CudaDriver(load()), std::memory_order_release);
  }
  return *loaded.load(std::memory_order_relaxed);
}

}  // namespace xlakern
