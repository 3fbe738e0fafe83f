#include "python_callback.h"

#include <string_view>

#include "cuda_driver.h"
#include "kernel_args.h"
#include "python_bridge.h"

namespace xlakern {

namespace {

struct PythonCallableState {
  static xla::ffi::TypeId id;
  std::shared_ptr<const PythonCallable> callable;
};
xla::ffi::TypeId PythonCallableState::id = XLA_FFI_UNKNOWN_TYPE_ID;
const XLA_FFI_TypeInfo kStateInfo = ffi::MakeTypeInfo<PythonCallableState>();

ffi::ErrorOr<std::unique_ptr<PythonCallableState>> instantiate(std::string_view key) {
  auto callable = std::dynamic_pointer_cast<const PythonCallable>(
      Registry::instance().find_kernel(std::string(key)));
  if (!callable) {
    return ffi::Unexpected(ffi::Error(
        ffi::ErrorCode::kNotFound,
        "xlakern: this program calls Python function " + std::string(key.substr(0, 16)) +
            "..., which this process has not registered; call the numba_cuda_callable "
            "wrapper in this process before running it."));
  }
  return std::make_unique<PythonCallableState>(PythonCallableState{std::move(callable)});
}

ffi::Error execute(CUstream stream, PythonCallableState* state,
                   std::string_view, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const PythonCallable& c = *state->callable;
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

XLA_FFI_DEFINE_HANDLER(kInstantiate, instantiate,
                       ffi::Ffi::BindInstantiate().Attr<std::string_view>("kernel"));
XLA_FFI_DEFINE_HANDLER(kExecute, execute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<CUstream>>()
                           .Ctx<ffi::State<PythonCallableState>>()
                           .Attr<std::string_view>("kernel")
                           .RemainingArgs()
                           .RemainingRets());

}  // namespace

XLA_FFI_Handler* python_callable_instantiate() { return kInstantiate; }
XLA_FFI_Handler* python_callable_execute() { return kExecute; }
XLA_FFI_TypeId* python_callable_state_type_id() { return &PythonCallableState::id; }
const XLA_FFI_TypeInfo* python_callable_state_type_info() { return &kStateInfo; }

}  // namespace xlakern
