// python_hooks.h -- the few places where a handler calls back into Python.
//
// Hot paths never do. Two paths must: explaining why a Numba CPU kernel
// failed (its compiled code reports only "an exception was raised"; Python
// re-runs it to recover the exception) and numba_cuda_callable, whose whole
// point is to run a Python function per call. The Python side installs one
// callable per purpose, once; handlers take the GIL only to call it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_args.h"

namespace xlakern {

// Bound to Python as xlakern._runtime.PythonHook: the bridge that needs a
// hook installs it by name before it registers its first kernel.
enum class PythonHook { kExplainNumbaError, kRunCallable };
constexpr int kPythonHookCount = 2;

// Installs `function` (a Python callable, as PyObject*; the runtime takes its
// own reference, held for the life of the process) for `hook`. The caller
// holds the GIL. This header stays free of Python's headers: handlers include it.
void set_python_hook(PythonHook hook, void* function);

// Calls the hook with (key, arrays, n_inputs, stream, device) where arrays is
// a list of (address, shape, dtype name) for inputs then outputs. Returns the
// string the hook returned ("" when it returned None), or a description of
// why the call itself failed.
std::string call_python_hook(PythonHook hook, const std::string& key,
                             const std::vector<ArgView>& arrays,
                             const std::vector<void*>& data, size_t n_inputs,
                             uintptr_t stream, int device);

}  // namespace xlakern
