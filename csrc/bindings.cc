// bindings.cc -- the xlakern._runtime Python module (nanobind).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/vector.h>

#include "cuda_image.h"
#include "numba_cpu.h"
#include "python_hooks.h"
#include "python_callable.h"
#include "registry.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;
using xlakern::Registry;

namespace {

nb::capsule capsule(const void* address) {
  return nb::steal<nb::capsule>(PyCapsule_New(const_cast<void*>(address), nullptr, nullptr));
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
    return nb::steal(PyCapsule_New(address, nullptr, nullptr));
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

  // --- The generic bridge targets: one handler per kind, kernels found by key.

  m.def("register_numba_cpu_kernel",
        [](const std::string& key, const std::string& name, uintptr_t address,
           const std::vector<std::string>& dtypes, const std::vector<int>& ranks,
           size_t n_inputs, bool serialize) {
          auto entry = reinterpret_cast<xlakern::NumbaCpuKernel::Entry>(address);
          return add_kernel(std::make_shared<xlakern::NumbaCpuKernel>(
              key, name, entry, arg_specs(dtypes, ranks), n_inputs, serialize));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("address"), nb::arg("dtypes"), nb::arg("ranks"),
        nb::arg("n_inputs"), nb::arg("serialize"),
        "Register a Numba @cfunc `int32(void**, int64*)` (address) under `key`; True if new.");

  m.def("register_cuda_image_kernel",
        [](const std::string& key, const std::string& name, nb::bytes image,
           const std::string& entry, const std::vector<std::string>& dtypes,
           const std::vector<int>& ranks, size_t n_inputs, std::array<unsigned, 3> grid,
           std::array<unsigned, 3> block, unsigned shared_mem) {
          std::string bytes(image.c_str(), image.size());
          return add_kernel(std::make_shared<xlakern::CudaImageKernel>(
              key, name, std::move(bytes), entry, arg_specs(dtypes, ranks), n_inputs, grid, block,
              shared_mem));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("image"), nb::arg("entry"), nb::arg("dtypes"),
        nb::arg("ranks"), nb::arg("n_inputs"), nb::arg("grid"), nb::arg("block"),
        nb::arg("shared_mem"),
        "Register a cubin/PTX kernel image with its launch configuration under `key`; True if new.");

  m.def("register_python_callable",
        [](const std::string& key, const std::string& name, size_t n_inputs) {
          return add_kernel(std::make_shared<xlakern::PythonCallable>(key, name, n_inputs));
        },
        nb::arg("key"), nb::arg("name"), nb::arg("n_inputs"),
        "Register a Python function run by the python-callable target under `key`; True if new.");

  m.def("set_python_hook", [](int which, nb::object callable) {
    if (which != 0 && which != 1) throw std::invalid_argument("unknown hook");
    xlakern::set_python_hook(static_cast<xlakern::PythonHook>(which), callable.ptr());
  }, nb::arg("which"), nb::arg("callable"),
  "Install the Python function the runtime calls to explain a Numba error (0) or run a callable (1).");

  m.def("bridge_targets", [] {
    // (target name, platform, {stage: handler capsule}, (type name, type id, type info),
    //  command-buffer compatible)
    nb::list out;
    auto add = [&](const char* target, const char* platform, nb::dict stages, const char* type_name,
                   const void* type_id, const void* type_info, bool graph_compatible = false) {
      out.append(nb::make_tuple(target, platform, stages,
                                nb::make_tuple(type_name, capsule(type_id), capsule(type_info)),
                                graph_compatible));
    };
    nb::dict cpu;
    cpu["instantiate"] = capsule(reinterpret_cast<void*>(xlakern::numba_cpu_instantiate()));
    cpu["execute"] = capsule(reinterpret_cast<void*>(xlakern::numba_cpu_execute()));
    add("xlakern.numba_cpu", "cpu", cpu, "xlakern.NumbaCpuState",
        xlakern::numba_cpu_state_type_id(), xlakern::numba_cpu_state_type_info());
    nb::dict cubin;
    cubin["instantiate"] = capsule(reinterpret_cast<void*>(xlakern::cuda_image_instantiate()));
    cubin["initialize"] = capsule(reinterpret_cast<void*>(xlakern::cuda_image_initialize()));
    cubin["execute"] = capsule(reinterpret_cast<void*>(xlakern::cuda_image_execute()));
    add("xlakern.cuda_image", "CUDA", cubin, "xlakern.CudaImageState", xlakern::cuda_image_state_type_id(),
        xlakern::cuda_image_state_type_info(), /*graph_compatible=*/true);
    nb::dict callable;
    callable["instantiate"] = capsule(reinterpret_cast<void*>(xlakern::python_callable_instantiate()));
    callable["execute"] = capsule(reinterpret_cast<void*>(xlakern::python_callable_execute()));
    add("xlakern.python_callable", "CUDA", callable, "xlakern.PythonCallableState",
        xlakern::python_callable_state_type_id(), xlakern::python_callable_state_type_info());
    return out;
  }, "The runtime's generic FFI targets, their stage handlers and state types.");

  m.def("enable_launch_probe", &xlakern::enable_launch_probe, nb::arg("on"),
        "Diagnostics: count CUDA-image handler executions and those inside stream capture (resets).");
  m.def("launch_probe", [] {
    auto p = xlakern::launch_probe();
    return nb::make_tuple(p.executions, p.captured);
  }, "(executions, executions during CUDA-graph capture) since enable_launch_probe.");

  m.def("kernel_count", [] { return Registry::instance().kernel_count(); }, "Number of kernels registered with the generic bridge targets.");

  m.attr("FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
