#include "tuning/autotune_log.h"

#include <cerrno>
#include <cstring>

namespace horo {

Status AutotuneLog::Open(const std::string& path) {
  file_.open(path, std::ios::out | std::ios::trunc);
  if (!file_.is_open()) {
    return Status::InvalidArgument("cannot open the autotune log '" + path + "' for writing: " +
                                   std::strerror(errno));
  }
  file_ << "sample,cycle_time_ms,tensor_fusion_threshold,small_message_bytes,score" << std::endl;
  return Status::OK();
}

void AutotuneLog::Sample(int number, const TunedParameters& parameters, double score) {
  Row(std::to_string(number), parameters, score);
}

void AutotuneLog::Best(const TunedParameters& parameters, double score) { Row("best", parameters, score); }

void AutotuneLog::Row(const std::string& sample, const TunedParameters& parameters, double score) {
  if (!file_.is_open()) return;
  file_ << sample << ',' << parameters.cycle_time_ms << ','
        << static_cast<double>(parameters.fusion_threshold_bytes) / (1 << 20) << ','
        << parameters.small_message_bytes << ',' << score << std::endl;
}

}  // namespace horo

