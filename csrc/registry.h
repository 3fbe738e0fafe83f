// registry.h -- the process-wide record of loaded kernel libraries.
//
// One registry serves compiled modules and the bridges. Compiled C++/CUDA
// sources: a module name maps to the content key it was built from and the
// library that holds its FFI handlers. Numba kernels and Python callables: a
// content key maps to a Kernel record that the runtime's generic handlers find
// at XLA's instantiate stage.
// XLA keeps raw handler pointers forever once a target is registered, and a
// compiled executable may run a kernel at any later time, so nothing that
// entered the registry is ever unloaded or freed.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "shared_library.h"

namespace xlakern {

struct ModuleRecord {
  std::string name;
  std::string key;       // content hash of everything the library was built from
  std::string platform;  // "cpu" or "CUDA"
  std::shared_ptr<SharedLibrary> library;
  std::vector<std::string> targets;  // FFI target names registered with XLA
  // XLA may hold pointers into the library: it is never unloaded from then on.
  bool pinned = false;
  // Every target of the module was registered. A pinned module that is not
  // complete had its registration fail part-way; it stays loaded for the
  // targets XLA accepted, and is never registered again.
  bool complete = false;
};

// A kernel run by one of the runtime's generic handlers (numba_cpu.h,
// cuda_image.h, python_callable.h derive from it). The handler's HLO names it
// only by `key`, a content hash, so an executable compiled in another process
// finds it or fails with a clear error, never a dangling pointer.
struct Kernel {
  Kernel(std::string key, std::string name) : key(std::move(key)), name(std::move(name)) {}
  virtual ~Kernel() = default;
  virtual const char* kind() const = 0;
  const std::string key;   // content hash, the `kernel` attribute of the custom call
  const std::string name;  // the user's function name, for messages
};

// Thrown when a module name is already taken by different content.
class ModuleConflict : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Registry {
 public:
  static Registry& instance();

  // Loads the library at `path` (or, when `fd` is not -1, the file open on
  // `fd`, which `path` then only names) as module `name` built from `key`.
  // Returns false (and loads nothing) when the same name and key are already
  // there; throws ModuleConflict when the name is taken by another key or by
  // a module whose registration failed part-way.
  bool open_module(const std::string& name, const std::string& key,
                   const std::string& path, const std::string& platform, int fd = -1);
  // Address of an exported symbol of a loaded module (throws if missing).
  void* symbol(const std::string& name, const std::string& symbol) const;
  // Marks the module as seen by XLA (call before handing it any handler):
  // from then on it is never unloaded.
  void pin(const std::string& name);
  // Records the targets XLA accepted, and whether they are all of them.
  void add_targets(const std::string& name, const std::vector<std::string>& targets,
                   bool complete);
  // Drops a module that XLA never saw, so a retry can load it again. Throws
  // for a pinned module: unloading it could leave XLA with dangling handlers.
  void forget(const std::string& name);
  std::vector<ModuleRecord> modules() const;

  // Adds a kernel under its key; when the key is already there the existing
  // record is kept (same content, same behaviour) and returned.
  std::shared_ptr<const Kernel> add_kernel(std::shared_ptr<const Kernel> kernel);
  // The kernel with this key, or nullptr.
  std::shared_ptr<const Kernel> find_kernel(const std::string& key) const;
  size_t kernel_count() const;

 private:
  Registry() = default;
  mutable std::mutex mutex_;
  std::map<std::string, ModuleRecord> modules_;
  std::map<std::string, std::shared_ptr<const Kernel>> kernels_;
};

}  // namespace xlakern
