#include "coordinator/stall_inspector.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "common/logging.h"

namespace horo {

std::string DescribeMissing(const std::vector<StalledTensor>& stalled) {
  std::map<int32_t, std::vector<std::string>> by_rank;
  for (const StalledTensor& t : stalled) {
    // The set tells apart a tensor that one rank submitted in another process set.
    const std::string name =
        t.process_set_id == 0 ? t.name : t.name + " (process set " + std::to_string(t.process_set_id) + ")";
    for (int32_t r : t.missing_ranks) by_rank[r].push_back(name);
  }
  std::ostringstream os;
  bool first_rank = true;
  for (const auto& kv : by_rank) {
    os << (first_rank ? "" : "; ") << "rank " << kv.first << ": [";
    first_rank = false;
    for (size_t i = 0; i < kv.second.size() && i < 6; ++i) os << (i ? ", " : "") << kv.second[i];
    if (kv.second.size() > 6) os << ", ... " << kv.second.size() - 6 << " more";
    os << "]";
  }
  return os.str();
}

bool StallInspector::Inspect(const std::vector<StalledTensor>& waiting, std::string* message) {
  if (!enabled()) return false;
  std::vector<StalledTensor> fresh;
  std::vector<StalledTensor> past_shutdown;
  double longest = 0;
  std::map<std::pair<int32_t, std::string>, bool> still_warned;  // forget tensors that completed
  for (const StalledTensor& t : waiting) {
    if (shutdown_seconds_ > 0 && t.waited_seconds >= shutdown_seconds_) {
      past_shutdown.push_back(t);
      longest = std::max(longest, t.waited_seconds);
    }
    if (!warns() || t.waited_seconds < warning_seconds_) continue;
    auto key = std::make_pair(t.process_set_id, t.name);
    if (!warned_.count(key)) fresh.push_back(t);
    still_warned[key] = true;
  }
  warned_.swap(still_warned);
  if (!fresh.empty()) {
    HORO_LOG(kWarning, 0) << "Stall: one or more tensors were submitted by some ranks and have waited more than "
                          << warning_seconds_ << " seconds for the others. Different ranks may be submitting "
                          << "different tensors, or some ranks none at all, which will deadlock. Missing ranks: "
                          << DescribeMissing(fresh);
  }
  if (!past_shutdown.empty()) {
    std::ostringstream os;
    os << "shutting down after tensors stalled for " << std::fixed << std::setprecision(1) << longest
       << std::defaultfloat << std::setprecision(6) << " seconds (" << shutdown_variable_ << "=" << shutdown_seconds_
       << "). Missing ranks: " << DescribeMissing(past_shutdown);
    *message = os.str();
    return true;
  }
  return false;
}

int StallInspector::PeriodMs() const {
  double shortest = 1e9;
  if (warns()) shortest = warning_seconds_;
  if (shutdown_seconds_ > 0) shortest = std::min(shortest, shutdown_seconds_);
  return static_cast<int>(std::max(10.0, std::min(1000.0, shortest * 250.0)));
}

}  // namespace horo
