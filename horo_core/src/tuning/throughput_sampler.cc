#include "tuning/throughput_sampler.h"

#include <algorithm>

namespace horo {

void ThroughputSampler::Restart() {
  window_open_ = false;
  measurements_.clear();
}

bool ThroughputSampler::Record(const std::vector<Tensor>& tensors, double now_us, double* score) {
  if (tensors.empty()) return false;
  bool closes_window = false;
  for (const Tensor& t : tensors) {
    auto it = seen_.find(t.name);
    if (it != seen_.end() && it->second >= steps_per_measurement_) closes_window = true;
  }
  if (window_open_ && closes_window) {
    // Two lists are never built in the same microsecond, but guard the division anyway.
    const double elapsed_us = std::max(now_us - window_start_us_, 1.0);
    measurements_.push_back(static_cast<double>(window_bytes_) / elapsed_us);
    window_open_ = false;
  }
  if (!window_open_) {
    window_open_ = true;
    window_start_us_ = now_us;
    window_bytes_ = 0;
    seen_.clear();
  }
  for (const Tensor& t : tensors) {
    ++seen_[t.name];
    window_bytes_ += t.bytes;
  }
  if (static_cast<int>(measurements_.size()) < kMeasurementsPerSample) return false;
  std::vector<double> sorted = measurements_;
  std::sort(sorted.begin(), sorted.end());
  *score = sorted[sorted.size() / 2];
  measurements_.clear();
  return true;
}

}  // namespace horo
