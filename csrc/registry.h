// registry.h -- the process-wide record of loaded kernel libraries.
//
// One registry serves every bridge: a module name maps to the content key it
// was built from and the library that holds its FFI handlers. XLA keeps raw
// handler pointers forever once a target is registered, so a library that
// entered the registry is never unloaded.
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
};

// Thrown when a module name is already taken by different content.
class ModuleConflict : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Registry {
 public:
  static Registry& instance();

  // Loads the library at `path` as module `name` built from `key`. Returns
  // false (and loads nothing) when the same name and key are already there;
  // throws ModuleConflict when the name is taken by another key.
  bool open_module(const std::string& name, const std::string& key,
                   const std::string& path, const std::string& platform);
  // Address of an exported symbol of a loaded module (throws if missing).
  void* symbol(const std::string& name, const std::string& symbol) const;
  void add_targets(const std::string& name, const std::vector<std::string>& targets);
  // Drops a module whose registration with XLA failed, so a retry can load it.
  void forget(const std::string& name);
  std::vector<ModuleRecord> modules() const;

 private:
  Registry() = default;
  mutable std::mutex mutex_;
  std::map<std::string, ModuleRecord> modules_;
};

}  // namespace xlakern
