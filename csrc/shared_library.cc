#include "shared_library.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xlakern {

SharedLibrary::SharedLibrary(const std::string& path) : origin_(path) { open(path); }

SharedLibrary::SharedLibrary(int fd, const std::string& origin) : origin_(origin) {
  fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (fd_ < 0) {
    throw std::runtime_error("cannot load " + origin_ + ": " + std::strerror(errno));
  }
  try {
    open("/proc/self/fd/" + std::to_string(fd_));
  } catch (...) {
    close(fd_);
    throw;
  }
}

void SharedLibrary::open(const std::string& path) {
  dlerror();
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load " + origin_ + ": " + (why ? why : "unknown dlopen error"));
  }
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
  if (fd_ >= 0) close(fd_);
}

void* SharedLibrary::find(const std::string& name) const {
  dlerror();
  void* address = dlsym(handle_, name.c_str());
  return dlerror() == nullptr ? address : nullptr;
}

}  // namespace xlakern
