#include "tuning/parameter_manager.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/logging.h"

namespace horo {
namespace {

constexpr double kBytesPerMiB = 1 << 20;
constexpr double kFusionMaxMiB = 64.0;
constexpr double kCycleMaxMs = 10.0;
// Horovod's seed points (fusion MiB, cycle ms), the cycle time rescaled from 1..100 to 0..10 ms.
constexpr double kSeeds[][2] = {{4, 0.4}, {32, 5}, {16, 2.5}, {8, 1}};
// Crossover values, a factor 8 apart: 0 is "always the ring".
constexpr int64_t kCrossoverLadder[] = {0, 8 << 10, 64 << 10, 512 << 10, 4 << 20};

bool IsMeasured(OpType op) {
  return op == OpType::kAllreduce || op == OpType::kAllgather || op == OpType::kBroadcast ||
         op == OpType::kAlltoall || op == OpType::kReducescatter;
}

}  // namespace

ParameterManager::ParameterManager(const Config& config, int rank)
    : rank_(rank),
      warmup_left_(config.autotune_warmup_samples),
      joint_budget_(config.autotune_bayes_opt_max_samples),
      crossover_fixed_(config.IsSetExplicitly("SMALL_MESSAGE_BYTES")),
      sampler_(config.autotune_steps_per_sample),
      optimizer_(static_cast<int>(!config.IsSetExplicitly("FUSION_THRESHOLD")) +
                     static_cast<int>(!config.IsSetExplicitly("CYCLE_TIME")),
                 config.autotune_gaussian_process_noise) {
  if (!config.IsSetExplicitly("FUSION_THRESHOLD")) dimensions_.push_back({true, 0.0, kFusionMaxMiB});
  if (!config.IsSetExplicitly("CYCLE_TIME")) dimensions_.push_back({false, 0.0, kCycleMaxMs});
  current_.fusion_threshold_bytes = config.fusion_threshold_bytes;
  current_.cycle_time_ms = config.cycle_time_ms;
  current_.small_message_bytes = config.small_message_bytes;
  best_ = current_;
  if (!config.autotune_log.empty()) {
    Status opened = log_.Open(config.autotune_log);
    if (!opened.ok()) HORO_LOG(kWarning, rank_) << opened.message() << "; autotuning goes on without a log";
  }
  seeds_.push_back(JointPoint(current_.fusion_threshold_bytes / kBytesPerMiB, current_.cycle_time_ms));
  for (const auto& seed : kSeeds) {
    std::vector<double> point = JointPoint(seed[0], seed[1]);
    if (std::find(seeds_.begin(), seeds_.end(), point) == seeds_.end()) seeds_.push_back(point);
  }
  if (dimensions_.empty() && crossover_fixed_) {
    HORO_LOG(kWarning, rank_) << "autotune: nothing to tune: HORO_FUSION_THRESHOLD, HORO_CYCLE_TIME and "
                                 "HORO_SMALL_MESSAGE_BYTES are all set explicitly";
    stage_ = Stage::kDone;
  } else if (warmup_left_ == 0) {
    StartJoint();
  }
}

std::vector<int64_t> ParameterManager::CrossoverCandidates(int64_t initial) {
  std::vector<int64_t> values = {initial};
  for (int64_t v : kCrossoverLadder) {
    if (v != initial) values.push_back(v);
  }
  return values;
}

std::vector<double> ParameterManager::JointPoint(double fusion_mb, double cycle_ms) const {
  std::vector<double> point;
  for (const Dimension& d : dimensions_) {
    const double value = d.is_fusion ? fusion_mb : cycle_ms;
    point.push_back(std::min(1.0, std::max(0.0, (value - d.low) / (d.high - d.low))));
  }
  return point;
}

void ParameterManager::SetJointPoint(const std::vector<double>& unit_point) {
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    const Dimension& d = dimensions_[i];
    const double value = d.low + unit_point[i] * (d.high - d.low);
    if (d.is_fusion) {
      current_.fusion_threshold_bytes = static_cast<int64_t>(std::llround(value * kBytesPerMiB));
    } else {
      current_.cycle_time_ms = value;
    }
  }
}

std::string ParameterManager::Describe(const TunedParameters& p) const {
  std::ostringstream os;
  os << "cycle time " << p.cycle_time_ms << " ms, fusion threshold " << p.fusion_threshold_bytes / kBytesPerMiB
     << " MiB, small messages up to " << p.small_message_bytes << " bytes";
  return os.str();
}

void ParameterManager::OnResponseList(ResponseList* list, double now_us) {
  if (!published_ || current_ != last_published_) {
    list->has_parameters = true;
    list->parameters = current_;
    last_published_ = current_;
    published_ = true;
    sampler_.Restart();
  }
  if (stage_ == Stage::kDone) return;
  std::vector<ThroughputSampler::Tensor> tensors;
  for (const auto& parts : list->fused) {
    for (const ResponsePart& part : parts) {
      const Response& r = part.response;
      if (r.process_set_id != 0 || r.kind != ResponseKind::kOp || !IsMeasured(r.op_type)) continue;
      tensors.push_back({r.name, r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype))});
    }
  }
  double score = 0.0;
  if (sampler_.Record(tensors, now_us, &score)) OnSample(score);
}

void ParameterManager::OnSample(double score) {
  if (stage_ == Stage::kWarmup) {
    --warmup_left_;
    HORO_LOG(kInfo, rank_) << "autotune: warm-up sample discarded (" << warmup_left_ << " left)";
    if (warmup_left_ <= 0) StartJoint();
    return;
  }
  ++samples_logged_;
  log_.Sample(samples_logged_, current_, score);
  HORO_LOG(kInfo, rank_) << "autotune: sample " << samples_logged_ << ": " << Describe(current_) << ": score "
                         << score << " bytes/us";
  if (stage_ == Stage::kJoint) {
    optimizer_.AddSample(JointPoint(current_.fusion_threshold_bytes / kBytesPerMiB, current_.cycle_time_ms), score);
    joint_settings_.push_back(current_);
    const size_t next = optimizer_.size();
    if (static_cast<int64_t>(next) < joint_budget_) {
      SetJointPoint(next < seeds_.size() ? seeds_[next] : optimizer_.NextSample());
      return;
    }
    const size_t best = optimizer_.BestSample();
    best_ = joint_settings_[best];
    best_score_ = optimizer_.score(best);
    current_ = best_;
    StartCrossover();
    return;
  }
  crossover_scores_.push_back(score);
  if (crossover_scores_.size() < crossover_values_.size()) {
    current_.small_message_bytes = crossover_values_[crossover_scores_.size()];
    return;
  }
  size_t best = 0;
  for (size_t i = 1; i < crossover_scores_.size(); ++i) {
    if (crossover_scores_[i] > crossover_scores_[best]) best = i;
  }
  best_.small_message_bytes = crossover_values_[best];
  best_score_ = crossover_scores_[best];
  Finish();
}

void ParameterManager::StartJoint() {
  if (dimensions_.empty()) {
    StartCrossover();
    return;
  }
  stage_ = Stage::kJoint;
  SetJointPoint(seeds_[0]);
}

void ParameterManager::StartCrossover() {
  if (crossover_fixed_) {
    Finish();
    return;
  }
  stage_ = Stage::kCrossover;
  crossover_values_ = CrossoverCandidates(current_.small_message_bytes);
  current_.small_message_bytes = crossover_values_[0];
}

void ParameterManager::Finish() {
  stage_ = Stage::kDone;
  current_ = best_;
  log_.Best(best_, best_score_);
  HORO_LOG(kInfo, rank_) << "autotune: done after " << samples_logged_ << " samples: chose " << Describe(best_)
                         << " (score " << best_score_ << " bytes/us)";
}

}  // namespace horo
