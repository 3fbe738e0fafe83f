// bindings.cc -- the xlakern._runtime Python module (nanobind).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/vector.h>

#include "bridge_target.h"
#include "cuda_image.h"
#include "numba_cpu.h"
#include "python_callable.h"
#include "python_hooks.h"
#include "registry.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;
using xlakern::BridgeTarget;
using xlakern::PythonHook;
using xlakern::Registry;

namespace {

// {stage: handler capsule}, the handler argument of jax.ffi.register_ffi_target.
nb::dict stage_handlers(const BridgeTarget& t) {
  nb::dict stages;
  stages["instantiate"] = nb::capsule(reinterpret_cast<const void*>(t.instantiate));
  if (t.initialize != nullptr) {
    stages["initialize"] = nb::capsule(reinterpret_cast<const void*>(t.initialize));
  }
  stages["execute"] = nb::capsule(reinterpret_cast<const void*>(t.execute));
  return stages;
}

std::vector<xlakern::ArgSpec> arg_specs(const std::vector<std::string>& dtypes,
                                        const std::vector<int>& ranks) {
  if (dtypes.size() != ranks.size()) throw std::invalid_argument("dtypes and ranks differ in length");
  std::vector<xlakern::ArgSpec> specs;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    specs.push_back({xlakern::dtype_from_name(dtypes[i]), ranks[i]});
  }
  return specs;
}

// Registers `kernel` and says whether it is new (False: the key was known).
bool add_kernel(std::shared_ptr<const xlakern::Kernel> kernel) {
  auto kept = Registry::instance().add_kernel(kernel);
  return kept == kernel;
}

}  // namespace

NB_MODULE(_runtime, m) {
  m.doc() = "xlakern's C++ runtime: kernel library loading and the FFI target registry.";

  nb::exception<xlakern::ModuleConflict>(m, "ModuleConflict");

  m.def("open_module", [](const std::string& name, const std::string& key,
                          const std::string& path, const std::string& platform, int fd) {
    return Registry::instance().open_module(name, key, path, platform, fd);
  }, nb::arg("name"), nb::arg("key"), nb::arg("path"), nb::arg("platform"), nb::arg("fd") = -1,
  "Load a kernel library as module `name` (from the file open on `fd` when given, `path` naming "
  "it); False if already loaded with the same key.");

  m.def("handler_capsule", [](const std::string& name, const std::string& symbol) {
    void* address = Registry::instance().symbol(name, symbol);
    return nb::capsule(address);
  }, nb::arg("name"), nb::arg("symbol"),
  "A PyCapsule holding the address of an exported FFI handler, for jax.ffi.register_ffi_target.");

  m.def("pin", [](const std::string& name) { Registry::instance().pin(name); },
        nb::arg("name"), "Mark module `name` as seen by XLA: it is never unloaded from then on.");
  m.def("add_targets", [](const std::string& name, const std::vector<std::string>& targets,
                          bool complete) {
    Registry::instance().add_targets(name, targets, complete);
  }, nb::arg("name"), nb::arg("targets"), nb::arg("complete"),
  "Record the targets XLA accepted for module `name`, and whether they are all of them.");
  m.def("forget", [](const std::string& name) { Registry::instance().forget(name); });

  m.def("modules", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string,
                           std::vector<std::string>>> out;
    for (const auto& r : Registry::instance().modules()) {
      out.emplace_back(r.name, r.key, r.platform, r.library->path(), r.targets);
    }
    return out;
  }, "(name, key, platform, path, targets) of every loaded module.");

  // --- The bridges: one generic FFI target per kind of kernel, kernels found by key.

  m.def("register_numba_cpu_kernel",
        [](const std::string& key, const std::string& name, uintptr_t address,
           const std::vector<std::string>& dtypes, const std::vector<int>& ranks,
           size_t n_inputs, bool serialize) {
          auto cfunc = reinterpret_cast<xlakern::NumbaCpuKernel::Cfunc>(address);
          return add_kernel(std::make_shared<xlakern::NumbaCpuKernel>(
              key, name, cfunc, arg_specs(dtypes, ranks), n_inputs, serialize));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("address"), nb::arg("dtypes"), nb::arg("ranks"),
        nb::arg("n_inputs"), nb::arg("serialize"),
        "Register a Numba @cfunc `int32(void**, int64*)` (address) under `key`; True if new.");

  m.def("register_cuda_image_kernel",
        [](const std::string& key, const std::string& name, nb::bytes image,
           const std::string& function_name, const std::vector<std::string>& dtypes,
           const std::vector<int>& ranks, size_t n_inputs, std::array<unsigned, 3> grid,
           std::array<unsigned, 3> block, unsigned shared_mem) {
          std::string bytes(image.c_str(), image.size());
          return add_kernel(std::make_shared<xlakern::CudaImageKernel>(
              key, name, std::move(bytes), function_name, arg_specs(dtypes, ranks), n_inputs, grid,
              block, shared_mem));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("image"), nb::arg("function_name"), nb::arg("dtypes"),
        nb::arg("ranks"), nb::arg("n_inputs"), nb::arg("grid"), nb::arg("block"),
        nb::arg("shared_mem"),
        "Register a cubin/PTX kernel image with its launch configuration under `key`; True if new.");

  m.def("register_python_callable",
        [](const std::string& key, const std::string& name, size_t n_inputs) {
          return add_kernel(std::make_shared<xlakern::PythonCallable>(key, name, n_inputs));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("n_inputs"),
        "Register a Python function run by the python-callable target under `key`; True if new.");

  nb::enum_<PythonHook>(m, "PythonHook",
                        "The Python functions bridge handlers call back: one per purpose.")
      .value("EXPLAIN_NUMBA_ERROR", PythonHook::kExplainNumbaError,
             "Re-runs a failed Numba CPU kernel to recover its exception's message.")
      .value("RUN_CALLABLE", PythonHook::kRunCallable,
             "Runs a numba_cuda_callable on XLA's buffers and stream.");

  m.def("set_python_hook", [](PythonHook hook, nb::callable function) {
    xlakern::set_python_hook(hook, function.ptr());
  }, nb::arg("hook"), nb::arg("function"),
  "Install `function(key, arrays, n_inputs, stream, device)` as the runtime's `hook`.");

  nb::class_<BridgeTarget>(m, "BridgeTarget",
                           "One bridge's generic FFI target, as registered with XLA.")
      .def_prop_ro("name", [](const BridgeTarget& t) { return std::string(t.name); },
                   "The FFI target name, e.g. 'xlakern.numba_cpu'.")
      .def_prop_ro("platform", [](const BridgeTarget& t) { return std::string(t.platform); },
                   "jax's platform name for it: 'cpu' or 'CUDA'.")
      .def_prop_ro("stage_handlers", &stage_handlers,
                   "{stage: handler capsule}, for jax.ffi.register_ffi_target.")
      .def_prop_ro("state_type_name",
                   [](const BridgeTarget& t) { return std::string(t.state_type_name); },
                   "The FFI type of its per-instruction state.")
      .def_prop_ro("state_type", [](const BridgeTarget& t) {
        nb::dict spec;
        spec["type_id"] = nb::capsule(static_cast<const void*>(t.state_type_id));
        spec["type_info"] = nb::capsule(static_cast<const void*>(t.state_type_info));
        return spec;
      }, "{'type_id', 'type_info'} capsules, for jax.ffi.register_ffi_type.")
      .def_prop_ro("command_buffer_compatible",
                   [](const BridgeTarget& t) { return t.command_buffer_compatible; },
                   "Whether XLA may capture its executions into a CUDA graph.")
      .def("__repr__", [](const BridgeTarget& t) {
        return std::string("<xlakern bridge target ") + t.name + " (" + t.platform + ")>";
      });

  m.def("bridge_targets", [] {
    nb::list targets;
    for (const BridgeTarget* t : {&xlakern::numba_cpu_target(), &xlakern::cuda_image_target(),
                                  &xlakern::python_callable_target()}) {
      targets.append(nb::cast(t, nb::rv_policy::reference));  // static descriptors: never copied
    }
    return targets;
  }, "The runtime's generic FFI targets, one per bridge.");

  m.def("enable_launch_probe", &xlakern::enable_launch_probe, nb::arg("on"),
        "Diagnostics: count CUDA-image handler executions and those inside stream capture (resets).");
  m.def("launch_probe", [] {
    auto p = xlakern::launch_probe();
    return nb::make_tuple(p.executions, p.captured);
  }, "(executions, executions during CUDA-graph capture) since enable_launch_probe.");

  m.def("kernel_count", [] { return Registry::instance().kernel_count(); }, "Number of kernels registered with the generic bridge targets.");

  m.attr("FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
