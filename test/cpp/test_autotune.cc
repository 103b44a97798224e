// sources: tuning/*.cc coordinator/response.cc common/config.cc common/logging.cc common/dtype.cc
//
// The autotuner without a network: the Cholesky solve and the Gaussian process against values
// worked out by hand, the Bayesian optimisation on synthetic score functions (with and without
// measurement noise: it must end within 10% of the best score, and the same scores must give the
// same points), the step-based throughput sampler on a synthetic clock, and the whole
// ParameterManager chain driving a simulated job whose step time depends on the parameters that
// the response lists carried: warm-up, joint stage, crossover stage, CSV log, fixed knobs,
// deterministic replay. Exits 1 on the first failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/response.h"
#include "tuning/bayesian_optimization.h"
#include "tuning/gaussian_process.h"
#include "tuning/parameter_manager.h"
#include "tuning/throughput_sampler.h"
#include "unit_check.h"

using namespace horo;
using horo_test::Check;
using horo_test::CheckOk;
using horo_test::Fail;

namespace {

bool Near(double a, double b, double tolerance) { return std::fabs(a - b) <= tolerance; }

std::string Text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// ---- Cholesky and the Gaussian process --------------------------------------------------------

void CheckCholesky() {
  // A = L L^T with L = [[2,0,0],[1,3,0],[-1,2,1]].
  const std::vector<double> a = {4, 2, -2, 2, 10, 5, -2, 5, 6};
  std::vector<double> lower;
  Check(CholeskyFactor(a, 3, &lower), "Cholesky of an SPD matrix");
  const std::vector<double> want = {2, 0, 0, 1, 3, 0, -1, 2, 1};
  for (int i = 0; i < 9; ++i) Check(Near(lower[i], want[i], 1e-12), "Cholesky factor entry " + std::to_string(i));
  const std::vector<double> b = {2, 37, 26};  // A * (1, 2, 3)
  const std::vector<double> x = CholeskySolve(lower, 3, b);
  for (int i = 0; i < 3; ++i) Check(Near(x[i], i + 1, 1e-10), "Cholesky solve x[" + std::to_string(i) + "]");
  Check(!CholeskyFactor({1, 2, 2, 1}, 2, &lower), "an indefinite matrix is rejected");
  std::printf("ok  cholesky\n");
}

void CheckGaussianProcess() {
  GaussianProcess gp;
  Check(!gp.Fit({}, {}, 1.0, 0.5, 0.1), "fit with no points fails");
  Check(!gp.Fit({{0.0}}, {1.0}, 1.0, 0.0, 0.1), "fit with a zero length scale fails");
  const std::vector<std::vector<double>> x = {{0.0}, {0.5}, {1.0}};
  const std::vector<double> y = {1.0, -1.0, 0.5};
  Check(gp.Fit(x, y, 1.0, 0.2, 0.0), "noise-free fit");
  for (size_t i = 0; i < x.size(); ++i) {
    double mean = 0, variance = 0;
    gp.Predict(x[i], &mean, &variance);
    Check(Near(mean, y[i], 1e-5), "noise-free GP interpolates point " + std::to_string(i) + ": " + Text(mean));
    Check(variance < 1e-5, "noise-free GP is certain at a measured point: " + Text(variance));
  }
  double mean = 0, variance = 0;
  gp.Predict({5.0}, &mean, &variance);
  Check(Near(mean, 0.0, 1e-9) && Near(variance, 1.0, 1e-9), "far from the data the prior (0, 1) returns");
  // One point with signal variance s = 2 and noise 1: mean = s y / (s + 1), variance = s - s^2 / (s + 1).
  Check(gp.Fit({{0.3, 0.3}}, {2.0}, 2.0, 0.5, 1.0), "one-point fit");
  gp.Predict({0.3, 0.3}, &mean, &variance);
  Check(Near(mean, 4.0 / 3, 1e-7) && Near(variance, 2.0 / 3, 1e-7), "one-point posterior: " + Text(mean) + ", " +
                                                                        Text(variance));
  // Log marginal likelihood of one point: -y^2 / (2 (s + noise)) - log(s + noise) / 2 - log(2 pi) / 2.
  const double want = -4.0 / 6.0 - 0.5 * std::log(3.0) - 0.5 * std::log(2 * 3.14159265358979323846);
  Check(Near(gp.log_marginal_likelihood(), want, 1e-6), "log marginal likelihood " + Text(gp.log_marginal_likelihood()));
  std::printf("ok  gaussian process\n");
}

// ---- Bayesian optimisation on synthetic scores ------------------------------------------------

// Deterministic multiplicative noise of about +-spread (a fixed linear congruential sequence).
struct Noise {
  uint64_t state = 12345;
  double spread = 0.0;
  double Next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double unit = static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);  // [0, 1)
    return 1.0 + spread * (2.0 * unit - 1.0);
  }
};

using ScoreFn = std::function<double(const std::vector<double>&)>;

// Runs the optimiser the way the ParameterManager does: seeds first, then its proposals, 20
// samples in all. Returns the chosen point; *trace gets every point measured.
std::vector<double> Optimise(int dimensions, const ScoreFn& f, double noise_spread,
                             std::vector<std::vector<double>>* trace) {
  std::vector<std::vector<double>> seeds;
  if (dimensions == 2) {
    seeds = {{1.0, 0.0}, {0.0625, 0.04}, {0.5, 0.5}, {0.25, 0.25}, {0.125, 0.1}};
  } else {
    seeds = {{1.0}, {0.0625}, {0.5}, {0.25}, {0.125}};
  }
  BayesianOptimization bo(dimensions, 0.8);
  Noise noise{12345, noise_spread};
  for (size_t i = 0; i < 20; ++i) {
    const std::vector<double> x = i < seeds.size() ? seeds[i] : bo.NextSample();
    for (double c : x) Check(c >= 0.0 && c <= 1.0, "proposed coordinate outside the unit box: " + Text(c));
    if (i >= seeds.size()) {
      for (const auto& measured : *trace) Check(measured != x, "the optimiser proposed a measured point again");
    }
    trace->push_back(x);
    bo.AddSample(x, f(x) * noise.Next());
  }
  return bo.point(bo.BestSample());
}

double GridMax(int dimensions, const ScoreFn& f) {
  double best = 0.0;
  const int n = 101;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < (dimensions == 2 ? n : 1); ++j) {
      std::vector<double> x = {i / (n - 1.0)};
      if (dimensions == 2) x.push_back(j / (n - 1.0));
      best = std::max(best, f(x));
    }
  }
  return best;
}

void CheckBayesianOptimisation() {
  struct Case {
    const char* name;
    int dimensions;
    ScoreFn f;
  };
  const std::vector<Case> cases = {
      {"interior peak", 2,
       [](const std::vector<double>& x) {
         const double d2 = (x[0] - 0.7) * (x[0] - 0.7) + (x[1] - 0.3) * (x[1] - 0.3);
         return 100.0 + 400.0 * std::exp(-d2 / (2 * 0.15 * 0.15));
       }},
      // Like the cycle time: every millisecond of delay costs, small buffers cost.
      {"optimum on a face", 2,
       [](const std::vector<double>& x) {
         return 1e6 / (30000.0 + 25000.0 * x[1] + 12000.0 * std::exp(-x[0] * 12.0));
       }},
      {"optimum in a corner", 2,
       [](const std::vector<double>& x) { return 5000.0 / (10.0 + 8.0 * (1 - x[0]) + 30.0 * x[1]); }},
      {"one dimension", 1,
       [](const std::vector<double>& x) { return 1000.0 / (20.0 + 30.0 * (x[0] - 0.8) * (x[0] - 0.8)); }},
  };
  for (const Case& c : cases) {
    const double best = GridMax(c.dimensions, c.f);
    for (double spread : {0.0, 0.05}) {
      std::vector<std::vector<double>> trace, replay;
      const std::vector<double> chosen = Optimise(c.dimensions, c.f, spread, &trace);
      const double ratio = c.f(chosen) / best;
      Check(ratio >= 0.9, std::string(c.name) + " with noise " + Text(spread) + ": chose a point scoring " +
                              Text(ratio) + " of the best");
      Optimise(c.dimensions, c.f, spread, &replay);
      Check(trace == replay, std::string(c.name) + ": the same scores must give the same points");
      std::printf("ok  bayesian optimisation, %s, noise +-%g: %.3f of the best\n", c.name, spread, ratio);
    }
  }
  BayesianOptimization empty(2, 0.8);
  Check(empty.NextSample() == std::vector<double>({0.5, 0.5}), "first proposal without samples is the centre");
}

// ---- throughput sampler ---------------------------------------------------------------------

std::vector<ThroughputSampler::Tensor> Tensors(const std::vector<std::string>& names, int64_t bytes) {
  std::vector<ThroughputSampler::Tensor> out;
  for (const std::string& n : names) out.push_back({n, bytes});
  return out;
}

void CheckThroughputSampler() {
  // Each step is two lists: {a, b} at the start, {c} 400 us later; the step period is 1000 us
  // and a step moves 300 bytes, so every measurement is 0.3 bytes/us.
  ThroughputSampler sampler(2);
  double score = 0;
  int samples = 0;
  double t = 0;
  // Open the window mid-step (at {c}) on purpose: it must still span whole steps.
  Check(!sampler.Record(Tensors({"c"}, 100), t + 400, &score), "first list completes nothing");
  Check(!sampler.Record({}, t + 500, &score), "a list without tensors is ignored");
  for (int step = 1; step <= 30 && samples == 0; ++step) {
    t = step * 1000.0;
    if (sampler.Record(Tensors({"a", "b"}, 100), t, &score)) ++samples;
    if (samples == 0 && sampler.Record(Tensors({"c"}, 100), t + 400, &score)) ++samples;
    if (samples == 1) {
      Check(Near(score, 0.3, 1e-12), "sampler score " + Text(score) + ", want 0.3 bytes/us");
      // 5 measurements of 2 steps each after the window opened at step 0's {c}.
      Check(Near(t + 400, 10400, 1e-9), "sample completed at " + Text(t + 400) + " us, want 10400");
    }
  }
  Check(samples == 1, "a sample completes after 5 measurements of 2 steps");
  // Median: four slow measurements and one fast one around it give the slow rate.
  ThroughputSampler median(1);
  const double periods[] = {1000, 1000, 100, 1000, 1000, 1000};  // first list only opens the window
  t = 0;
  bool done = false;
  for (double period : periods) {
    done = median.Record(Tensors({"x"}, 1000), t, &score);
    t += period;
  }
  Check(done && Near(score, 1.0, 1e-12), "median rejects one outlier: " + Text(score));
  // Restart forgets partial measurements.
  ThroughputSampler restarted(1);
  restarted.Record(Tensors({"x"}, 10), 0, &score);
  restarted.Record(Tensors({"x"}, 10), 10, &score);
  restarted.Restart();
  int lists = 0;
  for (t = 100; !restarted.Record(Tensors({"x"}, 10), t, &score); t += 10) ++lists;
  Check(lists == 5, "after a restart a sample needs 6 lists again, took " + std::to_string(lists + 1));
  std::printf("ok  throughput sampler\n");
}

// ---- the whole chain on a simulated job -------------------------------------------------------

// Step time of the simulated job, in microseconds, as a function of the parameters the ranks
// apply: a batching delay costs three rounds per step, a fusion threshold below the gradient
// size splits the allreduce into more rounds, and the crossover has a best value.
double StepMicros(const TunedParameters& p) {
  const double fusion_mb = p.fusion_threshold_bytes / double(1 << 20);
  const double crossover_penalty =
      p.small_message_bytes == (512 << 10) ? 0.0 : p.small_message_bytes == (64 << 10) ? 800.0 : 2000.0;
  return 20000.0 + 3 * 1000.0 * p.cycle_time_ms + 6000.0 * std::exp(-fusion_mb / 6.0) + crossover_penalty;
}

double BestStepMicros() {
  double best = 1e300;
  for (int f = 0; f <= 256; ++f) {
    for (int c = 0; c <= 100; ++c) {
      for (int64_t s : ParameterManager::CrossoverCandidates(64 << 10)) {
        TunedParameters p;
        p.fusion_threshold_bytes = static_cast<int64_t>(f / 4.0 * (1 << 20));
        p.cycle_time_ms = c / 10.0;
        p.small_message_bytes = s;
        best = std::min(best, StepMicros(p));
      }
    }
  }
  return best;
}

struct SimResult {
  int steps = 0;
  TunedParameters final_parameters;
  std::vector<std::string> csv;
  int lists_with_parameters = 0;
};

Config AutotuneConfig(const std::string& log) {
  Config config;
  config.autotune = true;
  config.autotune_log = log;
  config.autotune_warmup_samples = 2;
  config.autotune_steps_per_sample = 3;
  config.autotune_bayes_opt_max_samples = 12;
  return config;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> Split(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream ss(line);
  for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
  return fields;
}

// Runs the job until the tuner is done (or max_steps). Each step is two response lists: eight
// gradients of 4 MiB, then the remaining two; the ranks apply what a list carries before it runs.
SimResult Simulate(const Config& config, int max_steps) {
  ParameterManager manager(config, 0);
  TunedParameters applied;  // what the ranks run with; the first list must set it
  bool applied_set = false;
  SimResult result;
  double now = 0;
  std::vector<std::string> first, second;
  for (int i = 0; i < 8; ++i) first.push_back("grad." + std::to_string(i));
  second = {"grad.8", "grad.9"};
  for (int step = 0; step < max_steps && manager.tuning(); ++step) {
    for (int half = 0; half < 2; ++half) {
      ResponseList list;
      for (const std::string& name : half == 0 ? first : second) {
        ResponsePart part;
        part.response.name = name;
        part.response.dtype = DataType::kFloat32;
        part.response.shape = {1 << 20};
        list.fused.push_back({part});
      }
      ResponsePart other_set;  // not process set 0: never counted
      other_set.response.name = "grad.0";
      other_set.response.process_set_id = 1;
      other_set.response.shape = {1 << 30};
      list.fused.push_back({other_set});
      const TunedParameters decided = manager.parameters();
      manager.OnResponseList(&list, now);
      if (list.has_parameters) {
        ++result.lists_with_parameters;
        Check(list.parameters == decided, "a list carries the parameters decided before it was built");
        applied = list.parameters;
        applied_set = true;
      }
      Check(applied_set, "the first list must carry the parameters");
      now += StepMicros(applied) * (half == 0 ? 0.7 : 0.3);
    }
    result.steps = step + 1;
  }
  result.final_parameters = manager.parameters();
  Check(!manager.tuning(), "tuning did not end within " + std::to_string(max_steps) + " steps");
  // After the end, one more list publishes the final choice, and nothing changes afterwards.
  for (int i = 0; i < 3; ++i) {
    ResponseList list;
    ResponsePart part;
    part.response.name = "grad.0";
    part.response.shape = {1};
    list.fused.push_back({part});
    manager.OnResponseList(&list, now += 1000);
    if (list.has_parameters) applied = list.parameters;
    Check(!list.has_parameters || i == 0, "parameters published again after the end");
  }
  Check(applied == result.final_parameters, "the ranks end up applying the chosen parameters");
  if (!config.autotune_log.empty()) result.csv = ReadLines(config.autotune_log);
  return result;
}

void CheckParameterManager(const std::string& dir) {
  const std::string log = dir + "/autotune_free.csv";
  const Config config = AutotuneConfig(log);
  const int crossover_values = static_cast<int>(ParameterManager::CrossoverCandidates(64 << 10).size());
  const int samples = 2 + 12 + crossover_values;
  // A sample is 5 measurements of 3 steps, plus at most one step to restart after a change.
  const int bound = samples * (5 * 3 + 2);
  SimResult r = Simulate(config, bound);
  const double ratio = StepMicros(r.final_parameters) / BestStepMicros();
  Check(ratio <= 1.10, "chosen setting's step time is " + Text(ratio) + "x the best");
  Check(r.steps >= samples * 5 * 3, "tuning ended after " + std::to_string(r.steps) +
                                        " steps, fewer than its samples need");

  Check(r.csv.size() == static_cast<size_t>(1 + 12 + crossover_values + 1),
        "CSV has " + std::to_string(r.csv.size()) + " lines, want header + " +
            std::to_string(12 + crossover_values) + " samples + best");
  Check(r.csv[0] == "sample,cycle_time_ms,tensor_fusion_threshold,small_message_bytes,score",
        "CSV header: " + r.csv[0]);
  std::vector<std::string> distinct;
  for (size_t i = 1; i + 1 < r.csv.size(); ++i) {
    std::vector<std::string> f = Split(r.csv[i]);
    Check(f.size() == 5 && f[0] == std::to_string(i), "CSV row " + std::to_string(i) + ": " + r.csv[i]);
    Check(std::stod(f[4]) > 0, "CSV row has a positive score: " + r.csv[i]);
    const std::string setting = f[1] + "," + f[2] + "," + f[3];
    if (std::find(distinct.begin(), distinct.end(), setting) == distinct.end()) distinct.push_back(setting);
  }
  Check(distinct.size() >= 10, "the tuner tried only " + std::to_string(distinct.size()) + " settings");
  // The first tuning sample measures the configuration the job started with (defaults).
  Check(Split(r.csv[1])[1] == "0" && Split(r.csv[1])[2] == "64" && Split(r.csv[1])[3] == "65536",
        "first sample is the starting configuration: " + r.csv[1]);
  const std::vector<std::string> best = Split(r.csv.back());
  Check(best.size() == 5 && best[0] == "best", "last CSV row marks the chosen setting: " + r.csv.back());
  Check(Near(std::stod(best[1]), r.final_parameters.cycle_time_ms, 1e-4) &&
            Near(std::stod(best[2]) * (1 << 20), r.final_parameters.fusion_threshold_bytes, 64) &&
            std::stoll(best[3]) == r.final_parameters.small_message_bytes,
        "best row matches the final parameters: " + r.csv.back());
  Check(r.lists_with_parameters >= 10 && r.lists_with_parameters <= samples + 2,
        "parameters were published " + std::to_string(r.lists_with_parameters) + " times");
  std::printf("ok  parameter manager: done after %d steps, chose %s (%.3fx the best step time)\n", r.steps,
              r.csv.back().c_str(), ratio);

  // The same scores (the simulation is deterministic) give the same log.
  SimResult again = Simulate(config, bound);
  Check(again.csv == r.csv && again.steps == r.steps, "replaying the same job gives a different log");

  // An explicitly set fusion threshold stays fixed: every row shows it, the search is 1-D.
  Config fixed = AutotuneConfig(dir + "/autotune_fixed.csv");
  fixed.fusion_threshold_bytes = 8 << 20;
  fixed.from_environment.insert("FUSION_THRESHOLD");
  fixed.autotune_warmup_samples = 0;
  SimResult f = Simulate(fixed, bound);
  Check(f.final_parameters.fusion_threshold_bytes == (8 << 20), "fixed fusion threshold changed");
  for (size_t i = 1; i < f.csv.size(); ++i) {
    Check(Split(f.csv[i])[2] == "8", "fixed fusion threshold in CSV row: " + f.csv[i]);
  }
  Check(f.final_parameters.cycle_time_ms < 0.5, "cycle time chosen with fusion fixed: " +
                                                    Text(f.final_parameters.cycle_time_ms));

  // Fixed crossover and cycle time: only the fusion threshold moves.
  Config crossover_fixed = AutotuneConfig(dir + "/autotune_crossover.csv");
  crossover_fixed.small_message_bytes = 4096;
  crossover_fixed.cycle_time_ms = 0.25;
  crossover_fixed.from_environment = {"SMALL_MESSAGE_BYTES", "CYCLE_TIME"};
  SimResult c = Simulate(crossover_fixed, bound);
  Check(c.csv.size() == 1 + 12 + 1, "crossover fixed: no crossover samples, got " + std::to_string(c.csv.size()));
  for (size_t i = 1; i < c.csv.size(); ++i) {
    Check(Split(c.csv[i])[3] == "4096" && Split(c.csv[i])[1] == "0.25", "fixed knobs in CSV row: " + c.csv[i]);
  }
  Check(c.final_parameters.fusion_threshold_bytes >= (16 << 20), "fusion threshold chosen: " +
                                                                     Text(c.final_parameters.fusion_threshold_bytes));

  // Everything fixed: nothing to tune, the configuration is published once and never changes.
  Config all_fixed = AutotuneConfig(dir + "/autotune_none.csv");
  all_fixed.from_environment = {"FUSION_THRESHOLD", "CYCLE_TIME", "SMALL_MESSAGE_BYTES"};
  ParameterManager idle(all_fixed, 0);
  Check(!idle.tuning(), "nothing to tune, yet tuning");
  ResponseList list;
  idle.OnResponseList(&list, 0);
  Check(list.has_parameters && list.parameters.fusion_threshold_bytes == all_fixed.fusion_threshold_bytes,
        "the configuration is still published once");
  Check(ReadLines(dir + "/autotune_none.csv").size() == 1, "nothing to tune: header only");

  // A log that cannot be written does not stop tuning.
  Config unwritable = AutotuneConfig(dir + "/no/such/dir/log.csv");
  SimResult u = Simulate(unwritable, bound);
  Check(u.csv.empty(), "no log file appears in a missing directory");
  std::printf("ok  parameter manager: fixed knobs stay fixed, replay is identical\n");
}

// ---- the parameters on the wire ----------------------------------------------------------------

void CheckWire() {
  ResponseList list;
  list.has_parameters = true;
  list.parameters.fusion_threshold_bytes = 12345678;
  list.parameters.cycle_time_ms = 2.5;
  list.parameters.small_message_bytes = 512 << 10;
  ResponsePart part;
  part.response.name = "w";
  part.response.shape = {3};
  list.fused.push_back({part});
  ResponseList parsed;
  CheckOk(ParseResponseList(SerializeResponseList(list), &parsed), "parse a list with parameters");
  Check(parsed.has_parameters && parsed.parameters == list.parameters && parsed.fused.size() == 1,
        "parameters round-trip");
  ResponseList plain;
  CheckOk(ParseResponseList(SerializeResponseList(ResponseList()), &plain), "parse a list without parameters");
  Check(!plain.has_parameters, "no parameters unless set");
  std::string bad = SerializeResponseList(list);
  bad[0] = 2;
  Check(!ParseResponseList(bad, &parsed).ok(), "a parameter flag of 2 is malformed");
  list.parameters.cycle_time_ms = -1;
  Check(!ParseResponseList(SerializeResponseList(list), &parsed).ok(), "a negative cycle time is malformed");
  std::printf("ok  tuned parameters on the wire\n");
}

}  // namespace

int main() {
  char dir_template[] = "/tmp/horo_autotune_XXXXXX";
  const char* dir = mkdtemp(dir_template);
  Check(dir != nullptr, "mkdtemp");
  CheckCholesky();
  CheckGaussianProcess();
  CheckBayesianOptimisation();
  CheckThroughputSampler();
  CheckParameterManager(dir);
  CheckWire();
  std::printf("all autotune checks passed\n");
  return 0;
}
