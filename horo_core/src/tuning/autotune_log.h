// AutotuneLog: the CSV file of HORO_AUTOTUNE_LOG (HOROVOD_AUTOTUNE_LOG), written by rank 0.
//
// Columns: sample, cycle_time_ms, tensor_fusion_threshold, small_message_bytes, score. As in
// Horovod's log, tensor_fusion_threshold is in MiB and score in bytes per microsecond; "sample"
// is the 1-based number of the tuning sample (warm-up samples are not logged), and the last row,
// whose sample is "best", is the setting the autotuner chose with the score it measured there.
// Rows are flushed as they are written, so the file can be watched while the job runs.
#pragma once

#include <fstream>
#include <string>

#include "common/status.h"
#include "tuning/tuned_parameters.h"

namespace horo {

class AutotuneLog {
 public:
  // Creates (truncates) the file and writes the header.
  Status Open(const std::string& path);
  bool is_open() const { return file_.is_open(); }

  void Sample(int number, const TunedParameters& parameters, double score);
  void Best(const TunedParameters& parameters, double score);

 private:
  void Row(const std::string& sample, const TunedParameters& parameters, double score);

  std::ofstream file_;
};

}  // namespace horo
