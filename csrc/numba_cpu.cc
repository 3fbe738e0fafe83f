#include "numba_cpu.h"

#include <mutex>
#include <string_view>

#include "python_hooks.h"
#include "xlakern/ffi_thread_pool.h"
#include "xlakern/parallel_run.h"  // the runtime's one definition of the pooled parallel_for (parallel_zero)

namespace xlakern {

namespace {

using NumbaCpuState = BridgeState<NumbaCpuKernel>;

std::mutex workqueue_mutex;

ffi::Error kernel_error(const NumbaCpuKernel& k, const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    "xlakern Numba kernel '" + k.name + "' failed: " + what);
}

ffi::Error execute(ffi::ThreadPool pool, NumbaCpuState* state, std::string_view, int64_t zero,
                   ffi::RemainingArgs args, ffi::RemainingRets rets) {
  const NumbaCpuKernel& k = *state->kernel;
  // Reused per thread: the hot path allocates nothing after the first call.
  thread_local std::vector<ArgView> views;
  thread_local std::vector<void*> data;
  thread_local std::vector<int64_t> dims;
  thread_local BatchPlan plan;

  std::string problem = collect_args(args, rets, &views);
  if (problem.empty()) problem = plan.build(k.specs, k.n_inputs, views);
  if (!problem.empty()) return kernel_error(k, problem);

  // zeroed_outputs: bit o of `zero` clears output o, the whole (batched) buffer, once.
  if (zero != 0) {
    xk::detail::FfiThreadPool pool_ref(pool);  // large clears split over XLA's pool
    xk::detail::ThreadPoolScope scope(pool_ref.ref());
    for (size_t o = 0; o < 64 && k.n_inputs + o < views.size(); ++o) {
      const int64_t bytes = byte_size(views[k.n_inputs + o]);
      if (((zero >> o) & 1) && bytes > 0) xk::detail::parallel_zero(views[k.n_inputs + o].data, size_t(bytes));
    }
  }
  dims.clear();
  for (size_t a = 0; a < views.size(); ++a) {
    const int64_t* d = plan.item_dims(views, a);
    dims.insert(dims.end(), d, d + k.specs[a].rank);
  }
  data.resize(views.size());
  for (int64_t b = 0; b < plan.count(); ++b) {
    for (size_t a = 0; a < views.size(); ++a) data[a] = plan.data(views, a, b);
    int32_t status;
    if (k.serialize) {
      std::lock_guard<std::mutex> lock(workqueue_mutex);
      status = k.cfunc(data.data(), dims.data());
    } else {
      status = k.cfunc(data.data(), dims.data());
    }
    if (status != 0) {
      // Rare path: Python re-runs the kernel on these arrays to recover the
      // exception's type and message.
      std::vector<ArgView> items(views);
      for (size_t a = 0; a < items.size(); ++a) {
        items[a].dims = plan.item_dims(views, a);
        items[a].rank = k.specs[a].rank;
      }
      std::unique_lock<std::mutex> lock(workqueue_mutex, std::defer_lock);
      if (k.serialize) lock.lock();  // the re-run enters parallel code too
      std::string why = call_python_hook(PythonHook::kExplainNumbaError, k.key, items, data,
                                         k.n_inputs, 0, -1);
      return kernel_error(k, why.empty() ? "it raised an exception" : why);
    }
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kExecute, execute,
                       bind_bridge_execute<NumbaCpuKernel>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));

}  // namespace

const BridgeTarget& numba_cpu_target() {
  static const BridgeTarget target = describe_bridge_target<NumbaCpuKernel>(
      "xlakern.numba_cpu", "cpu", "xlakern.NumbaCpuState", /*initialize=*/nullptr, kExecute,
      /*command_buffer_compatible=*/false);
  return target;
}

}  // namespace xlakern
