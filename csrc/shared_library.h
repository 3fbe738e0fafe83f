// shared_library.h -- RAII owner of one dlopen'd library.
#pragma once

#include <string>

namespace xlakern {

class SharedLibrary {
 public:
  // Opens `path` with RTLD_NOW | RTLD_LOCAL: unresolved symbols fail here,
  // not at the first kernel call, and modules never see each other's symbols.
  explicit SharedLibrary(const std::string& path);
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // Address of `name`, or nullptr when the library does not export it.
  void* find(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
};

}  // namespace xlakern
