#include "registry.h"

#include <stdexcept>

namespace xlakern {

Registry& Registry::instance() {
  // Never destroyed: XLA may call handlers of registered modules until exit.
  static Registry* registry = new Registry();
  return *registry;
}

bool Registry::open_module(const std::string& name, const std::string& key,
                           const std::string& path, const std::string& platform, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = modules_.find(name);
  if (it != modules_.end()) {
    if (it->second.pinned && !it->second.complete) {
      throw ModuleConflict("module '" + name + "' failed part-way through an earlier registration " +
                           "with XLA; its library stays loaded for the targets XLA accepted (" +
                           std::to_string(it->second.targets.size()) + ") and cannot be registered again");
    }
    if (it->second.key == key && it->second.platform == platform) return false;
    throw ModuleConflict("module '" + name + "' is already registered from other content (key " +
                         it->second.key.substr(0, 12) + ", new key " + key.substr(0, 12) + ")");
  }
  auto library = fd >= 0 ? std::make_shared<SharedLibrary>(fd, path)
                         : std::make_shared<SharedLibrary>(path);
  using AbiFn = int (*)();
  auto abi = reinterpret_cast<AbiFn>(library->find("xk_glue_abi_version"));
  if (abi == nullptr) {
    throw std::runtime_error(path + " is not an xlakern kernel library (no xk_glue_abi_version)");
  }
  modules_[name] = ModuleRecord{name, key, platform, std::move(library), {}};
  return true;
}

void* Registry::symbol(const std::string& name, const std::string& symbol) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = modules_.find(name);
  if (it == modules_.end()) throw std::runtime_error("module '" + name + "' is not loaded");
  void* address = it->second.library->find(symbol);
  if (address == nullptr) {
    throw std::runtime_error("module '" + name + "' (" + it->second.library->path() +
                             ") does not export " + symbol);
  }
  return address;
}

void Registry::pin(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = modules_.find(name);
  if (it == modules_.end()) throw std::runtime_error("module '" + name + "' is not loaded");
  it->second.pinned = true;
}

void Registry::add_targets(const std::string& name, const std::vector<std::string>& targets,
                           bool complete) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = modules_.find(name);
  if (it == modules_.end()) throw std::runtime_error("module '" + name + "' is not loaded");
  it->second.targets.insert(it->second.targets.end(), targets.begin(), targets.end());
  it->second.complete = complete;
}

void Registry::forget(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = modules_.find(name);
  if (it == modules_.end()) return;
  if (it->second.pinned) {
    throw std::runtime_error("module '" + name + "' was handed to XLA and cannot be unloaded");
  }
  modules_.erase(it);
}

std::vector<ModuleRecord> Registry::modules() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ModuleRecord> out;
  for (const auto& item : modules_) out.push_back(item.second);
  return out;
}

std::shared_ptr<const Kernel> Registry::add_kernel(std::shared_ptr<const Kernel> kernel) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto inserted = kernels_.emplace(kernel->key, kernel);
  return inserted.first->second;
}

std::shared_ptr<const Kernel> Registry::find_kernel(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = kernels_.find(key);
  return it == kernels_.end() ? nullptr : it->second;
}

size_t Registry::kernel_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kernels_.size();
}

}  // namespace xlakern
