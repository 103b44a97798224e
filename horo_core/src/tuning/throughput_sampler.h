// ThroughputSampler: turns the stream of executed responses into scores, bytes per microsecond,
// one score per sample.
//
// Horo has no explicit training-step marker, so a step is recognised by its tensors, as Horovod
// does: a training loop submits the same named tensors once per step. A measurement window opens
// at a response list and closes at the first later list that brings a tensor name for the
// (steps_per_measurement + 1)-th time since the window opened; that list starts the next window.
// Wherever in a step the window opened, it then spans exactly steps_per_measurement step periods
// (compute, negotiation and communication included) and the bytes of exactly that many steps, so
// bytes / time is inversely proportional to the step time. A sample's score is the median of
// kMeasurementsPerSample consecutive measurements (Horovod's SAMPLES), which rejects the
// occasional step that a neighbour's job or a garbage collection stretched.
//
// Times come from the caller (rank 0's steady clock, when a response list is built), which keeps
// this class deterministic under test.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace horo {

class ThroughputSampler {
 public:
  static constexpr int kMeasurementsPerSample = 5;

  // One response's contribution: its tensor name and bytes.
  struct Tensor {
    std::string name;
    int64_t bytes = 0;
  };

  explicit ThroughputSampler(int64_t steps_per_measurement) : steps_per_measurement_(steps_per_measurement) {}

  // Forgets the open window and the measurements of the current sample (the parameters changed);
  // the next list recorded opens a new window.
  void Restart();
  // Records the responses of one list, seen at now_us. Returns true when this list completed a
  // sample, with its score in *score.
  bool Record(const std::vector<Tensor>& tensors, double now_us, double* score);

 private:
  int64_t steps_per_measurement_;
  bool window_open_ = false;
  double window_start_us_ = 0.0;
  int64_t window_bytes_ = 0;
  std::map<std::string, int64_t> seen_;  // times each name appeared in the open window
  std::vector<double> measurements_;
};

}  // namespace horo
