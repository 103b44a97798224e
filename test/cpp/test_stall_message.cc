// sources: coordinator/stall_inspector.cc common/logging.cc common/config.cc
//
// The stall messages that name what each rank is missing: tensors grouped by rank, at most six
// names per rank, and the process set of a tensor outside the global set, so that a tensor one
// rank submitted in another set does not read as the same tensor missing on both sides. Exits 1
// on the first failure.
#include <cstdio>
#include <string>
#include <vector>

#include "coordinator/stall_inspector.h"
#include "unit_check.h"

using namespace horo;
using horo_test::Check;

int main() {
  std::vector<StalledTensor> stalled(2);
  stalled[0].name = "allreduce.t";
  stalled[0].missing_ranks = {0};
  stalled[1].process_set_id = 1;
  stalled[1].name = "allreduce.t";
  stalled[1].missing_ranks = {1};
  const std::string text = DescribeMissing(stalled);
  Check(text == "rank 0: [allreduce.t]; rank 1: [allreduce.t (process set 1)]", "sets named: " + text);

  std::vector<StalledTensor> many(8);
  for (int i = 0; i < 8; ++i) {
    many[i].name = "g." + std::to_string(i);
    many[i].missing_ranks = {2};
  }
  const std::string cut = DescribeMissing(many);
  Check(cut == "rank 2: [g.0, g.1, g.2, g.3, g.4, g.5, ... 2 more]", "six names per rank: " + cut);

  StallInspector inspector(0.0, 1.0, false);
  std::vector<StalledTensor> late(1);
  late[0].name = "x";
  late[0].missing_ranks = {1};
  late[0].waited_seconds = 2.5;
  std::string message;
  Check(inspector.Inspect(late, &message), "a tensor past the shutdown time stops the job");
  Check(message.find("stalled for 2.5 seconds (HORO_STALL_SHUTDOWN_TIME_SECONDS=1). Missing ranks: rank 1: [x]") !=
            std::string::npos,
        "shutdown message: " + message);
  std::printf("stall messages: ok\n");
  return 0;
}
