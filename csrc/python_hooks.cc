// Python.h comes first, as Python requires of its embedders.
#define PY_SSIZE_T_CLEAN  // "s#" passes the key's length as Py_ssize_t
#include <Python.h>

#include "python_hooks.h"

#include <mutex>

namespace xlakern {

namespace {

std::mutex hooks_mutex;
// Strong references held for the life of the process: handlers may run until
// exit, and dropping a reference at static destruction time would need the GIL.
PyObject* hooks[2] = {nullptr, nullptr};

PyObject* get_hook(PythonHook hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  return hooks[static_cast<int>(hook)];
}

// The text of the pending Python exception, which is cleared.
std::string fetch_error_text() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = "unknown Python error";
  if (value != nullptr) {
    PyObject* s = PyObject_Str(value);
    if (s != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(s);
      if (utf8 != nullptr) text = utf8;
      Py_DECREF(s);
    }
  }
  if (type != nullptr) {
    text = std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) + ": " + text;
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  PyErr_Clear();
  return text;
}

// [(address, shape, dtype name), ...] for the hook.
PyObject* describe_arrays(const std::vector<ArgView>& arrays, const std::vector<void*>& data) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(arrays.size()));
  if (list == nullptr) return nullptr;
  for (size_t a = 0; a < arrays.size(); ++a) {
    PyObject* shape = PyTuple_New(arrays[a].rank);
    for (int d = 0; d < arrays[a].rank; ++d) {
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(arrays[a].dims[d]));
    }
    PyObject* item = Py_BuildValue("(KNs)", static_cast<unsigned long long>(
                                                reinterpret_cast<uintptr_t>(data[a])),
                                   shape, dtype_name(arrays[a].dtype));
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(a), item);
  }
  return list;
}

}  // namespace

void set_python_hook(PythonHook hook, void* callable) {
  auto* obj = static_cast<PyObject*>(callable);
  Py_XINCREF(obj);
  std::lock_guard<std::mutex> lock(hooks_mutex);
  PyObject* old = hooks[static_cast<int>(hook)];
  hooks[static_cast<int>(hook)] = obj;
  Py_XDECREF(old);  // the caller holds the GIL
}

std::string call_python_hook(PythonHook hook, const std::string& key,
                             const std::vector<ArgView>& arrays,
                             const std::vector<void*>& data, size_t n_inputs,
                             uintptr_t stream, int device) {
  if (!Py_IsInitialized()) return "the Python interpreter is not running";
  PyGILState_STATE gil = PyGILState_Ensure();
  std::string result;
  PyObject* fn = get_hook(hook);
  if (fn == nullptr) {
    result = "xlakern's Python hook is not installed";
  } else {
    PyObject* described = describe_arrays(arrays, data);
    PyObject* ret = nullptr;
    if (described != nullptr) {
      ret = PyObject_CallFunction(fn, "s#NnKi", key.data(), static_cast<Py_ssize_t>(key.size()),
                                  described, static_cast<Py_ssize_t>(n_inputs),
                                  static_cast<unsigned long long>(stream), device);
    }
    if (ret == nullptr) {
      result = "xlakern's Python hook failed: " + fetch_error_text();
    } else {
      if (ret != Py_None) {
        const char* utf8 = PyUnicode_Check(ret) ? PyUnicode_AsUTF8(ret) : nullptr;
        result = utf8 != nullptr ? utf8 : "xlakern's Python hook returned a non-string";
        if (utf8 == nullptr) PyErr_Clear();
      }
      Py_DECREF(ret);
    }
  }
  PyGILState_Release(gil);
  return result;
}

}  // namespace xlakern
