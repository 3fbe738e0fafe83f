// bindings.cc -- the xlakern._runtime Python module (nanobind).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "xla/ffi/api/c_api.h"
#include "registry.h"

namespace nb = nanobind;
using xlakern::Registry;

NB_MODULE(_runtime, m) {
  m.doc() = "xlakern's C++ runtime: kernel library loading and the FFI target registry.";

  nb::exception<xlakern::ModuleConflict>(m, "ModuleConflict");

  m.def("open_module", [](const std::string& name, const std::string& key,
                          const std::string& path, const std::string& platform) {
    return Registry::instance().open_module(name, key, path, platform);
  }, nb::arg("name"), nb::arg("key"), nb::arg("path"), nb::arg("platform"),
  "Load a kernel library as module `name`; False if already loaded with the same key.");

  m.def("handler_capsule", [](const std::string& name, const std::string& symbol) {
    void* address = Registry::instance().symbol(name, symbol);
    return nb::steal(PyCapsule_New(address, nullptr, nullptr));
  }, nb::arg("name"), nb::arg("symbol"),
  "A PyCapsule holding the address of an exported FFI handler, for jax.ffi.register_ffi_target.");

  m.def("add_targets", [](const std::string& name, const std::vector<std::string>& targets) {
    Registry::instance().add_targets(name, targets);
  });
  m.def("forget", [](const std::string& name) { Registry::instance().forget(name); });

  m.def("modules", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string,
                           std::vector<std::string>>> out;
    for (const auto& r : Registry::instance().modules()) {
      out.emplace_back(r.name, r.key, r.platform, r.library->path(), r.targets);
    }
    return out;
  }, "(name, key, platform, path, targets) of every loaded module.");

  m.attr("FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
