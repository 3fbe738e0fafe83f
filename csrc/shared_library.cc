#include "shared_library.h"

#include <dlfcn.h>

#include <stdexcept>

namespace xlakern {

SharedLibrary::SharedLibrary(const std::string& path) : path_(path) {
  dlerror();
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load " + path + ": " + (why ? why : "unknown dlopen error"));
  }
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* SharedLibrary::find(const std::string& name) const {
  dlerror();
  void* address = dlsym(handle_, name.c_str());
  return dlerror() == nullptr ? address : nullptr;
}

}  // namespace xlakern
