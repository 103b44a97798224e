// ParameterManager: Horo's autotuner (HORO_AUTOTUNE / HOROVOD_AUTOTUNE, hororun --autotune). It
// lives on global rank 0, watches the responses of process set 0 while the job trains, and tunes
// three settings during the first steps:
//
//   fusion threshold    (HORO_FUSION_THRESHOLD, 0 .. 64 MiB)  } jointly, by Bayesian optimisation
//   cycle time          (HORO_CYCLE_TIME, 0 .. 10 ms)         } (bayesian_optimization.h)
//   allreduce crossover (HORO_SMALL_MESSAGE_BYTES)            then, with those fixed, each of a few
//                                                             values in turn ("categorical")
//
// As in Horovod, the stages form a chain tuned one after the other, a setting the user set
// explicitly (environment or hororun flag) is held fixed and drops out of the search, the first
// warm-up samples are discarded, a sample's score is bytes per microsecond over a few steps
// (throughput_sampler.h), and every sample is logged (autotune_log.h). When the chain ends, the
// chosen setting stays for the rest of the job.
//
// The cycle-time range is narrower than Horovod's 1 .. 100 ms because Horo's loop is event-driven:
// the delay is only spent when tensors are waiting, where it may gather more of them into one
// negotiation round, and beyond a few milliseconds it can only add latency to every round.
// Horovod's seed points are kept, rescaled to that range, after the setting the job started with
// (so the autotuner always measures the configuration it would otherwise have kept).
//
// Publishing: the manager attaches its parameters to the next response list after they change
// (and to the first list, so that every rank starts from rank 0's values); every rank applies them
// before executing that list. The fusion threshold takes effect in the coordinator as soon as it
// is decided, so the list that carries new parameters is already fused with them. The sample
// after a change starts at that list.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "coordinator/response.h"
#include "tuning/autotune_log.h"
#include "tuning/bayesian_optimization.h"
#include "tuning/throughput_sampler.h"
#include "tuning/tuned_parameters.h"

namespace horo {

class ParameterManager {
 public:
  // The initial parameters and which of them are fixed come from config. rank is for log lines.
  ParameterManager(const Config& config, int rank);

  // Rank 0, once per response list before it is sent: attaches changed parameters to the list and
  // accounts its process set 0 responses, seen at now_us (a steady clock in microseconds).
  void OnResponseList(ResponseList* list, double now_us);

  // The parameters in effect now (the fusion threshold is what the coordinator must use).
  const TunedParameters& parameters() const { return current_; }
  bool tuning() const { return stage_ != Stage::kDone; }

  // The candidate values of the allreduce crossover (small-message bytes).
  static std::vector<int64_t> CrossoverCandidates(int64_t initial);

 private:
  enum class Stage { kWarmup, kJoint, kCrossover, kDone };
  // One knob of the joint (Bayesian) stage.
  struct Dimension {
    bool is_fusion;  // fusion threshold in MiB, else cycle time in ms
    double low;
    double high;
  };

  void OnSample(double score);
  void StartJoint();
  void StartCrossover();
  void Finish();
  // Sets the joint knobs from a point of the unit box, and the reverse.
  void SetJointPoint(const std::vector<double>& unit_point);
  std::vector<double> JointPoint(double fusion_mb, double cycle_ms) const;
  std::string Describe(const TunedParameters& p) const;

  int rank_;
  int64_t warmup_left_;
  int64_t joint_budget_;
  std::vector<Dimension> dimensions_;
  bool crossover_fixed_;
  ThroughputSampler sampler_;
  BayesianOptimization optimizer_;
  AutotuneLog log_;

  Stage stage_ = Stage::kWarmup;
  TunedParameters current_;
  bool published_ = false;
  TunedParameters last_published_;
  int samples_logged_ = 0;

  std::vector<std::vector<double>> seeds_;  // unit points measured before the optimiser proposes
  std::vector<TunedParameters> joint_settings_;  // the setting of every joint sample, in order
  std::vector<int64_t> crossover_values_;
  std::vector<double> crossover_scores_;
  TunedParameters best_;
  double best_score_ = 0.0;
};

}  // namespace horo
