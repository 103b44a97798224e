// Enforce macros: build a Status that prints both compared values ("allreduce count: 12 vs 16").
#pragma once

#include <sstream>
#include <string>

#include "common/status.h"

namespace horo {

template <typename A, typename B>
std::string DescribeMismatch(const std::string& what, const A& a, const B& b) {
  std::ostringstream os;
  os << what << ": " << a << " vs " << b;
  return os.str();
}

// Returns Status::InvalidArgument from the enclosing function unless a == b.
#define HORO_ENFORCE_EQ(a, b, what)                                                     \
  do {                                                                                  \
    if (!((a) == (b))) return ::horo::Status::InvalidArgument(::horo::DescribeMismatch((what), (a), (b))); \
  } while (0)

// Returns Status::InvalidArgument with the message unless cond holds.
#define HORO_ENFORCE(cond, message)                                               \
  do {                                                                            \
    if (!(cond)) return ::horo::Status::InvalidArgument(message);                 \
  } while (0)

}  // namespace horo
