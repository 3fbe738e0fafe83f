// nanobind includes Python.h, which must come first, as Python requires of its embedders.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "python_hooks.h"

#include <array>
#include <exception>
#include <mutex>
#include <utility>

namespace nb = nanobind;

namespace xlakern {

namespace {

std::mutex hooks_mutex;

// Never destroyed: handlers may run until exit, and dropping a reference at
// static destruction time would need the GIL.
std::array<nb::object, kPythonHookCount>& hooks() {
  static auto* installed = new std::array<nb::object, kPythonHookCount>();
  return *installed;
}

nb::object get_hook(PythonHook hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  return hooks()[static_cast<size_t>(hook)];  // a new reference: the caller holds the GIL
}

// UTF-8 text of a Python str, or nullptr (the error cleared) when it has none
// (a lone surrogate).
const char* utf8_or_null(const nb::str& s) {
  const char* utf8 = s.c_str();
  if (utf8 == nullptr) PyErr_Clear();
  return utf8;
}

// "TypeName: message" of a Python exception.
std::string error_text(const nb::python_error& error) {
  std::string text = "unknown Python error";
  try {
    if (const char* utf8 = utf8_or_null(nb::str(error.value()))) text = utf8;
  } catch (const nb::python_error&) {  // its str() raised: keep the placeholder
  }
  const auto* type = reinterpret_cast<PyTypeObject*>(error.type().ptr());
  return std::string(type->tp_name) + ": " + text;
}

// [(address, shape, dtype name), ...] for the hook.
nb::list describe_arrays(const std::vector<ArgView>& arrays, const std::vector<void*>& data) {
  nb::list described;
  for (size_t a = 0; a < arrays.size(); ++a) {
    nb::list dims;
    for (int d = 0; d < arrays[a].rank; ++d) dims.append(arrays[a].dims[d]);
    const auto address = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(data[a]));
    described.append(nb::make_tuple(address, nb::tuple(dims), dtype_name(arrays[a].dtype)));
  }
  return described;
}

std::string call_with_gil(PythonHook hook, const std::string& key,
                          const std::vector<ArgView>& arrays, const std::vector<void*>& data,
                          size_t n_inputs, uintptr_t stream, int device) {
  nb::object function = get_hook(hook);
  if (!function.is_valid()) return "xlakern's Python hook is not installed";
  try {
    nb::object result = function(key, describe_arrays(arrays, data), n_inputs,
                                 static_cast<unsigned long long>(stream), device);
    if (result.is_none()) return {};
    if (!nb::isinstance<nb::str>(result)) return "xlakern's Python hook returned a non-string";
    const char* utf8 = utf8_or_null(nb::borrow<nb::str>(result));
    return utf8 != nullptr ? utf8 : "xlakern's Python hook returned a non-string";
  } catch (const nb::python_error& error) {
    return "xlakern's Python hook failed: " + error_text(error);
  } catch (const std::exception& error) {  // a failed conversion: nothing may escape into XLA
    return std::string("xlakern's Python hook failed: ") + error.what();
  }
}

}  // namespace

void set_python_hook(PythonHook hook, void* function) {
  nb::object replaced = nb::borrow(static_cast<PyObject*>(function));
  {
    std::lock_guard<std::mutex> lock(hooks_mutex);
    std::swap(hooks()[static_cast<size_t>(hook)], replaced);
  }
  // `replaced` now holds the previous hook, released here (the caller holds
  // the GIL) outside the lock: its finalizer may run Python code.
}

std::string call_python_hook(PythonHook hook, const std::string& key,
                             const std::vector<ArgView>& arrays,
                             const std::vector<void*>& data, size_t n_inputs,
                             uintptr_t stream, int device) {
  if (!Py_IsInitialized()) return "the Python interpreter is not running";
  nb::gil_scoped_acquire gil;
  return call_with_gil(hook, key, arrays, data, n_inputs, stream, device);
}

}  // namespace xlakern
