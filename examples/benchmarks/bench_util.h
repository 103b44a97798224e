// Shared by the standalone C++ benchmark programs of this folder (allreduce_variants.cc,
// cma_allreduce_bench.cc): stop with the message of a failed setup step.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/status.h"

inline void Require(const horo::Status& status, const std::string& what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.message().c_str());
  std::exit(1);
}
