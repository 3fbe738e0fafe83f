// shared_library.h -- RAII owner of one dlopen'd library.
#pragma once

#include <string>

namespace xlakern {

class SharedLibrary {
 public:
  // Opens `path` with RTLD_NOW | RTLD_LOCAL: unresolved symbols fail here,
  // not at the first kernel call, and modules never see each other's symbols.
  explicit SharedLibrary(const std::string& path);
  // Opens the file open on `fd` (the caller keeps and closes `fd`), through
  // /proc/self/fd, so the library loaded is the file the caller checked, not
  // whatever `origin` names by then. `origin` is its name for messages.
  SharedLibrary(int fd, const std::string& origin);
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // Address of `name`, or nullptr when the library does not export it.
  void* find(const std::string& name) const;
  // Where the library came from (for messages and diagnostics).
  const std::string& path() const { return origin_; }

 private:
  void open(const std::string& path);

  std::string origin_;
  void* handle_ = nullptr;
  // Our own duplicate of the caller's descriptor, open while the library is:
  // glibc recognises a loaded library by its path, so a /proc/self/fd/N whose
  // N got reused would make a later dlopen return this library.
  int fd_ = -1;
};

}  // namespace xlakern
