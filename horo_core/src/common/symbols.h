// ResolveSymbol: one function of a library loaded with dlopen at run time (the CUDA driver, NCCL,
// libtorch's C shim), so that nothing is linked against it at build time.
#pragma once

#include <dlfcn.h>

#include <string>

namespace horo {

// Sets *out to symbol's address in library. When it is missing, *out is null and, unless missing
// is null (an optional symbol) or already names one, *missing names it.
template <typename Fn>
bool ResolveSymbol(void* library, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out == nullptr && missing != nullptr && missing->empty()) *missing = symbol;
  return *out != nullptr;
}

}  // namespace horo
