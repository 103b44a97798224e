// sources: coordinator/stall_inspector.cc
//
// The stall messages that name what each rank is missing (tensors grouped by rank, at most six
// names per rank, and the process set of a tensor outside the global set, so that a tensor one
// rank submitted in another set does not read as the same tensor missing on both sides), when
// they are due, and what the shutdown message names. Exits 1 on the first failure.
#include <cstdio>
#include <string>
#include <vector>

#include "coordinator/stall_inspector.h"
#include "unit_check.h"

using namespace horo;
using horo_test::Check;

namespace {

// A tensor that one rank is missing, after waited seconds.
StalledTensor Stalled(const std::string& name, int32_t missing_rank, double waited = 0, int32_t set = 0) {
  StalledTensor t;
  t.process_set_id = set;
  t.name = name;
  t.missing_ranks = {missing_rank};
  t.waited_seconds = waited;
  return t;
}

}  // namespace

int main() {
  const std::vector<StalledTensor> stalled = {Stalled("allreduce.t", 0), Stalled("allreduce.t", 1, 0, 1)};
  const std::string text = DescribeMissing(stalled);
  Check(text == "rank 0: [allreduce.t]; rank 1: [allreduce.t (process set 1)]", "sets named: " + text);

  std::vector<StalledTensor> many;
  for (int i = 0; i < 8; ++i) many.push_back(Stalled("g." + std::to_string(i), 2));
  const std::string cut = DescribeMissing(many);
  Check(cut == "rank 2: [g.0, g.1, g.2, g.3, g.4, g.5, ... 2 more]", "six names per rank: " + cut);

  // The shutdown message names every tensor still waiting: here rank 0 is blocked in "y", which
  // rank 1 has not submitted, while rank 1 waits longer for "x".
  StallInspector inspector(0.0, 1.0, false);
  std::vector<StalledTensor> late = {Stalled("x", 0, 2.5), Stalled("y", 1, 0.5)};
  const std::string message = inspector.Inspect(late).shutdown;
  Check(message.find("stalled for 2.5 seconds (HORO_STALL_SHUTDOWN_TIME_SECONDS=1). Missing ranks: rank 0: [x]; "
                     "rank 1: [y]") != std::string::npos,
        "shutdown message: " + message);
  late[0].waited_seconds = 0.9;
  Check(inspector.Inspect(late).shutdown.empty(), "no shutdown before the shutdown time");

  // Warnings: the first after the warning time, then one after every further warning time.
  StallInspector warner(10.0, 0.0, false);
  std::vector<StalledTensor> waiting = {Stalled("z", 3)};
  const double waits[] = {5, 10.5, 15, 20.4, 20.6, 29, 31};
  const size_t warnings[] = {0, 1, 0, 0, 1, 0, 1};
  for (size_t i = 0; i < 7; ++i) {
    waiting[0].waited_seconds = waits[i];
    const StallInspector::Report report = warner.Inspect(waiting);
    Check(report.warnings.size() == warnings[i], "warnings after " + std::to_string(waits[i]) + " s");
    Check(report.shutdown.empty(), "no shutdown without a shutdown time");
    if (i == 1) {
      Check(report.warnings[0].find("have waited more than 10 seconds") != std::string::npos &&
                report.warnings[0].find("Missing ranks: rank 3: [z]") != std::string::npos,
            "first warning: " + report.warnings[0]);
    }
    if (i == 4) {
      Check(report.warnings[0] == "Stall: tensors still waiting, the longest for 21 seconds. Missing ranks: "
                                  "rank 3: [z]",
            "repeated warning: " + report.warnings[0]);
    }
  }
  // A tensor that completed is forgotten: waiting again, it is warned about as new.
  Check(warner.Inspect({}).warnings.empty(), "nothing waiting");
  waiting[0].waited_seconds = 11;
  const StallInspector::Report anew = warner.Inspect(waiting);
  Check(anew.warnings.size() == 1 && anew.warnings[0].find("have waited more than") != std::string::npos,
        "a completed tensor is forgotten");
  // Tensors that cross the warning time by the next inspection (a period, 1 s here) join the
  // warning due now; the rest wait for one of their own.
  StallInspector together(10.0, 0.0, false);
  const std::vector<StalledTensor> step = {Stalled("g1", 1, 10.2), Stalled("g2", 1, 9.3), Stalled("g3", 1, 8.5)};
  const StallInspector::Report first = together.Inspect(step);
  Check(first.warnings.size() == 1 && first.warnings[0].find("rank 1: [g1, g2]") != std::string::npos,
        "one warning for the tensors crossing together: " + (first.warnings.empty() ? "" : first.warnings[0]));
  Check(together.Inspect({Stalled("g1", 1, 10.4), Stalled("g2", 1, 9.5), Stalled("g3", 1, 8.7)}).warnings.empty(),
        "nothing new below the warning time");
  const std::vector<StalledTensor> later = {Stalled("g1", 1, 11.8), Stalled("g2", 1, 10.9), Stalled("g3", 1, 10.1)};
  const StallInspector::Report second = together.Inspect(later);
  Check(second.warnings.size() == 1 && second.warnings[0].find("rank 1: [g3]") != std::string::npos,
        "the last tensor's own warning: " + (second.warnings.empty() ? "" : second.warnings[0]));
  std::printf("stall messages: ok\n");
  return 0;
}
