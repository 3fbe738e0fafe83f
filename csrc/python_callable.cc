#include "python_callable.h"

#include <string_view>

#include "cuda_image.h"
#include "cuda_driver.h"
#include "kernel_args.h"
#include "python_hooks.h"

namespace xlakern {

namespace {

using PythonCallableState = BridgeState<PythonCallable>;

ffi::Error execute(CUstream stream, PythonCallableState* state,
                   std::string_view, int64_t zero, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const PythonCallable& c = *state->kernel;
  std::vector<ArgView> views;
  std::string problem = collect_args(args, rets, &views);
  int device = -1;
  if (problem.empty()) {
    // The device of XLA's stream, so Python uses Numba's context for it.
    try {
      const CudaDriver& cu = cuda_driver();
      CUcontext ctx = nullptr;
      CUresult rc = cu.cuStreamGetCtx(stream, &ctx);
      if (rc == kCudaSuccess) rc = cu.cuCtxPushCurrent(ctx);
      if (rc == kCudaSuccess) {
        rc = cu.cuCtxGetDevice(&device);
        CUcontext popped = nullptr;
        cu.cuCtxPopCurrent(&popped);
      }
      if (rc != kCudaSuccess) problem = cu.describe("finding the stream's device", rc);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  if (problem.empty()) {
    try {  // on XLA's stream, so the Python function's launches see the zeros
      problem = zero_outputs_on_stream(views, c.n_inputs, zero, stream);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  if (problem.empty()) {
    std::vector<void*> data;
    for (const auto& v : views) data.push_back(v.data);
    problem = call_python_hook(PythonHook::kRunCallable, c.key, views, data, c.n_inputs,
                               reinterpret_cast<uintptr_t>(stream), device);
  }
  if (!problem.empty()) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      "xlakern numba_cuda_callable '" + c.name + "' failed: " + problem);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kExecute, execute,
                       bind_bridge_execute<PythonCallable>(
                           ffi::Ffi::Bind().Ctx<ffi::PlatformStream<CUstream>>()));

}  // namespace

const BridgeTarget& python_callable_target() {
  static const BridgeTarget target = describe_bridge_target<PythonCallable>(
      "xlakern.python_callable", "CUDA", "xlakern.PythonCallableState", /*initialize=*/nullptr,
      kExecute, /*command_buffer_compatible=*/false);
  return target;
}

}  // namespace xlakern
