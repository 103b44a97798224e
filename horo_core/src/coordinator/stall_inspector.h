// StallInspector: notices tensors that some ranks submitted and others did not, for longer than
// the stall time, and names the missing ranks and tensors, so that a hang is never silent.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace horo {

struct StalledTensor {
  int32_t process_set_id = 0;
  std::string name;
  std::vector<int32_t> missing_ranks;
  double waited_seconds = 0;
};

class StallInspector {
 public:
  // shutdown_variable: the environment variable named in the shutdown message.
  StallInspector(double warning_seconds, double shutdown_seconds, bool disabled,
                 std::string shutdown_variable = "HORO_STALL_SHUTDOWN_TIME_SECONDS")
      : warning_seconds_(warning_seconds),
        shutdown_seconds_(shutdown_seconds),
        disabled_(disabled),
        shutdown_variable_(std::move(shutdown_variable)) {}

  // What one inspection of the tensors still waiting found: the warnings to log (none when none
  // is due) and, when the shutdown time has passed for any of them, the message that stops the job.
  struct Report {
    std::vector<std::string> warnings;
    std::string shutdown;
  };
  // Warns about a tensor once it has waited the warning time, and again after every further
  // warning time it waits (Horovod repeats its warning at every check), so that a job hung for
  // hours still says why. Tensors within one inspection period of the warning time join a warning
  // that is due, so that a step's gradients make one warning, not two. The shutdown message
  // names every tensor still waiting, not only those past the shutdown time: the rank blocked
  // longest may be waiting for a tensor a peer submitted later. The shutdown applies whenever it
  // is set, also below the warning time or with warnings disabled (Horovod ignored it there,
  // which left a job the user asked to stop waiting for ever).
  Report Inspect(const std::vector<StalledTensor>& waiting);
  bool warns() const { return !disabled_ && warning_seconds_ > 0; }
  bool enabled() const { return warns() || shutdown_seconds_ > 0; }
  // How often to inspect: a quarter of the shortest time that matters, within [10 ms, 1 s].
  int PeriodMs() const;

 private:
  double warning_seconds_;
  double shutdown_seconds_;
  bool disabled_;
  std::string shutdown_variable_;
  // (process set, name) of each tensor warned about -> how long it had waited at the last warning.
  std::map<std::pair<int32_t, std::string>, double> warned_;
};

// "1: [grad.w, grad.b]; 3: [grad.w]" — at most a few names per rank.
std::string DescribeMissing(const std::vector<StalledTensor>& stalled);

}  // namespace horo
