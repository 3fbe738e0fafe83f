#include "cuda_image.h"

#include <atomic>
#include <stdexcept>
#include <string_view>

namespace xlakern {

CUfunction CudaImageKernel::function_for(CUcontext ctx) const {
  if (first_ctx_.load(std::memory_order_acquire) == ctx) return first_function_;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& item : loaded_) {
    if (item.first == ctx) return item.second;
  }
  const CudaDriver& cu = cuda_driver();
  CUresult rc = cu.cuCtxPushCurrent(ctx);
  if (rc != kCudaSuccess) throw std::runtime_error(cu.describe("cuCtxPushCurrent", rc));
  // Modules are never unloaded: graphs XLA captured may launch them later.
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  std::string problem;
  rc = cu.cuModuleLoadData(&module, image.data());
  if (rc != kCudaSuccess) {
    problem = cu.describe("cuModuleLoadData", rc) +
              "; the image was built for another GPU architecture or a newer driver";
  } else if ((rc = cu.cuModuleGetFunction(&function, module, function_name.c_str())) !=
             kCudaSuccess) {
    problem = cu.describe("cuModuleGetFunction", rc) + " for entry '" + function_name + "'";
  } else if (shared_mem > 48 * 1024 &&
             (rc = cu.cuFuncSetAttribute(function, kFuncAttributeMaxDynamicSharedSizeBytes,
                                         static_cast<int>(shared_mem))) != kCudaSuccess) {
    problem = cu.describe("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", rc) + " for " +
              std::to_string(shared_mem) + " bytes of dynamic shared memory";
  }
  CUcontext popped = nullptr;
  cu.cuCtxPopCurrent(&popped);
  if (!problem.empty()) throw std::runtime_error(problem);
  loaded_.emplace_back(ctx, function);
  if (loaded_.size() == 1) {
    first_function_ = function;
    first_ctx_.store(ctx, std::memory_order_release);  // publishes first_function_
  }
  return function;
}

std::string zero_outputs_on_stream(const std::vector<ArgView>& views, size_t n_inputs,
                                   int64_t mask, CUstream stream) {
  if (mask == 0) return {};
  const CudaDriver& cu = cuda_driver();
  for (size_t o = 0; o < 64 && n_inputs + o < views.size(); ++o) {
    const int64_t bytes = byte_size(views[n_inputs + o]);
    if (!((mask >> o) & 1) || bytes == 0) continue;
    CUresult rc = cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(views[n_inputs + o].data), 0,
                                     static_cast<size_t>(bytes), stream);
    if (rc != kCudaSuccess) return cu.describe("cuMemsetD8Async", rc);
  }
  return {};
}

namespace {

std::atomic<bool> probe_on{false};
std::atomic<int64_t> probe_executions{0};
std::atomic<int64_t> probe_captured{0};

void record_probe(const CudaDriver& cu, CUstream stream) {
  probe_executions.fetch_add(1, std::memory_order_relaxed);
  int status = 0;
  if (cu.cuStreamIsCapturing(stream, &status) == kCudaSuccess && status == 1) {
    probe_captured.fetch_add(1, std::memory_order_relaxed);
  }
}

using CudaImageState = BridgeState<CudaImageKernel>;

using Stream = ffi::PlatformStream<CUstream>;

ffi::Error kernel_error(const CudaImageKernel& k, const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    "xlakern CUDA kernel '" + k.name + "' failed: " + what);
}

// Loads the module for the stream's context before any execution, so that
// execute never loads one while XLA is capturing a CUDA graph.
ffi::Error initialize(CUstream stream, CudaImageState* state, std::string_view, int64_t) {
  try {
    const CudaDriver& cu = cuda_driver();
    CUcontext ctx = nullptr;
    CUresult rc = cu.cuStreamGetCtx(stream, &ctx);
    if (rc != kCudaSuccess) return kernel_error(*state->kernel, cu.describe("cuStreamGetCtx", rc));
    state->kernel->function_for(ctx);
  } catch (const std::exception& e) {
    return kernel_error(*state->kernel, e.what());
  }
  return ffi::Error::Success();
}

ffi::Error execute(CUstream stream, CudaImageState* state, std::string_view, int64_t zero,
                   ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const CudaImageKernel& k = *state->kernel;
  thread_local std::vector<ArgView> views;
  thread_local BatchPlan plan;
  thread_local std::vector<int64_t> slots;  // every kernel parameter, 8 bytes each
  thread_local std::vector<void*> params;   // cuLaunchKernel's pointers into `slots`
  thread_local std::vector<size_t> data_slot;

  std::string problem = collect_args(args, rets, &views);
  if (problem.empty()) problem = plan.build(k.specs, k.n_inputs, views);
  if (!problem.empty()) return kernel_error(k, problem);

  try {
    const CudaDriver& cu = cuda_driver();
    if (probe_on.load(std::memory_order_relaxed)) record_probe(cu, stream);
    const bool empty_launch = k.grid[0] * k.grid[1] * k.grid[2] == 0 ||
                              k.block[0] * k.block[1] * k.block[2] == 0;
    // Nothing to launch: give every output defined contents (XLA does not
    // clear them) instead of whatever the allocator handed out.
    const bool nothing = empty_launch || plan.count() == 0;
    problem = zero_outputs_on_stream(views, k.n_inputs, nothing ? -1 : zero, stream);
    if (!problem.empty()) return kernel_error(k, problem);
    if (nothing) return ffi::Error::Success();

    CUcontext ctx = nullptr;
    CUresult rc = cu.cuStreamGetCtx(stream, &ctx);
    if (rc != kCudaSuccess) return kernel_error(k, cu.describe("cuStreamGetCtx", rc));
    CUfunction function = k.function_for(ctx);

    slots.clear();
    data_slot.clear();
    for (size_t a = 0; a < views.size(); ++a) {
      const int rank = k.specs[a].rank;
      const int64_t* dims = plan.item_dims(views, a);
      const int64_t itemsize = dtype_size(views[a].dtype);
      int64_t nitems = 1;
      for (int d = 0; d < rank; ++d) nitems *= dims[d];
      slots.push_back(0);  // meminfo
      slots.push_back(0);  // parent
      slots.push_back(nitems);
      slots.push_back(itemsize);
      data_slot.push_back(slots.size());
      slots.push_back(0);  // data, set per batch element
      slots.insert(slots.end(), dims, dims + rank);
      const size_t strides_at = slots.size();
      slots.resize(strides_at + rank);
      int64_t stride = itemsize;  // C-contiguous, in bytes
      for (int d = rank - 1; d >= 0; --d) {
        slots[strides_at + d] = stride;
        stride *= dims[d];
      }
    }
    params.resize(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) params[i] = &slots[i];

    for (int64_t b = 0; b < plan.count(); ++b) {
      for (size_t a = 0; a < views.size(); ++a) {
        slots[data_slot[a]] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(plan.data(views, a, b)));
      }
      rc = cu.cuLaunchKernel(function, k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1],
                             k.block[2], k.shared_mem, stream, params.data(), nullptr);
      if (rc != kCudaSuccess) return kernel_error(k, cu.describe("cuLaunchKernel", rc));
    }
  } catch (const std::exception& e) {
    return kernel_error(k, e.what());
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kInitialize, initialize,
                       ffi::Ffi::BindInitialize()
                           .Ctx<Stream>()
                           .Ctx<ffi::State<CudaImageState>>()
                           .Attr<std::string_view>("kernel").Attr<int64_t>("zero"));
XLA_FFI_DEFINE_HANDLER(kExecute, execute,
                       bind_bridge_execute<CudaImageKernel>(ffi::Ffi::Bind().Ctx<Stream>()),
                       {ffi::Traits::kCmdBufferCompatible});

}  // namespace

void enable_launch_probe(bool on) {
  probe_executions = 0;
  probe_captured = 0;
  probe_on = on;
}

LaunchProbe launch_probe() { return {probe_executions.load(), probe_captured.load()}; }

const BridgeTarget& cuda_image_target() {
  static const BridgeTarget target = describe_bridge_target<CudaImageKernel>(
      "xlakern.cuda_image", "CUDA", "xlakern.CudaImageState", kInitialize, kExecute,
      /*command_buffer_compatible=*/true);
  return target;
}

}  // namespace xlakern
