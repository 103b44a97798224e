#include "coordinator/stall_inspector.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

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

StallInspector::Report StallInspector::Inspect(const std::vector<StalledTensor>& waiting) {
  Report report;
  if (!enabled()) return report;
  std::vector<StalledTensor> fresh;
  std::vector<StalledTensor> again;
  double longest = 0;
  double longest_again = 0;
  std::map<std::pair<int32_t, std::string>, double> still_warned;  // forget tensors that completed
  // Tensors submitted together (a step's gradients) cross the warning time within moments of each
  // other: once one warning is due, those that would cross it by the next inspection join it,
  // instead of making a second warning a period later.
  bool due = false;
  for (const StalledTensor& t : waiting) {
    due = due || (t.waited_seconds >= warning_seconds_ && warned_.count({t.process_set_id, t.name}) == 0);
  }
  const double threshold = due ? warning_seconds_ - PeriodMs() / 1000.0 : warning_seconds_;
  for (const StalledTensor& t : waiting) {
    longest = std::max(longest, t.waited_seconds);
    if (!warns()) continue;
    auto key = std::make_pair(t.process_set_id, t.name);
    auto last = warned_.find(key);
    double warned_at = last == warned_.end() ? -1 : last->second;
    if (warned_at < 0) {
      if (t.waited_seconds < threshold) continue;
      fresh.push_back(t);
      warned_at = t.waited_seconds;
    } else if (t.waited_seconds >= warned_at + warning_seconds_) {
      again.push_back(t);
      longest_again = std::max(longest_again, t.waited_seconds);
      warned_at = t.waited_seconds;
    }
    still_warned[key] = warned_at;
  }
  warned_.swap(still_warned);
  if (!fresh.empty()) {
    std::ostringstream os;
    os << "Stall: one or more tensors were submitted by some ranks and have waited more than " << warning_seconds_
       << " seconds for the others. Different ranks may be submitting different tensors, or some ranks none at "
       << "all, which will deadlock. Missing ranks: " << DescribeMissing(fresh);
    report.warnings.push_back(os.str());
  }
  if (!again.empty()) {
    std::ostringstream os;
    os << "Stall: tensors still waiting, the longest for " << std::fixed << std::setprecision(0) << longest_again
       << " seconds. Missing ranks: " << DescribeMissing(again);
    report.warnings.push_back(os.str());
  }
  if (shutdown_seconds_ > 0 && longest >= shutdown_seconds_) {
    std::ostringstream os;
    os << "shutting down after tensors stalled for " << std::fixed << std::setprecision(1) << longest
       << std::defaultfloat << std::setprecision(6) << " seconds (" << shutdown_variable_ << "=" << shutdown_seconds_
       << "). Missing ranks: " << DescribeMissing(waiting);
    report.shutdown = os.str();
  }
  return report;
}

int StallInspector::PeriodMs() const {
  double shortest = 1e9;
  if (warns()) shortest = warning_seconds_;
  if (shutdown_seconds_ > 0) shortest = std::min(shortest, shutdown_seconds_);
  return static_cast<int>(std::max(10.0, std::min(1000.0, shortest * 250.0)));
}

}  // namespace horo
