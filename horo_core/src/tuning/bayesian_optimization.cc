#include "tuning/bayesian_optimization.h"

#include <algorithm>
#include <cmath>

namespace horo {
namespace {

// Candidate length scales, in units of the box side, and signal variances, in units of the
// (standardised) score variance.
constexpr double kLengthScales[] = {0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.5};
constexpr double kSignalVariances[] = {0.25, 0.5, 1, 2, 4, 8, 16, 32};
// Improvement below this (in standardised units) is not worth a sample.
constexpr double kExploration = 0.01;
// About this many grid points in total, whatever the dimension.
constexpr double kGridPoints = 1024;

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * 3.14159265358979323846); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

}  // namespace

BayesianOptimization::BayesianOptimization(int dimensions, double noise) : dimensions_(dimensions), noise_(noise) {}

void BayesianOptimization::AddSample(const std::vector<double>& point, double score) {
  points_.push_back(point);
  scores_.push_back(score);
}

bool BayesianOptimization::FitModel(GaussianProcess* model) const {
  const size_t n = scores_.size();
  double mean = 0.0;
  for (double s : scores_) mean += s;
  mean /= n;
  double spread = 0.0;
  for (double s : scores_) spread += (s - mean) * (s - mean);
  spread = std::sqrt(spread / n);
  if (!(spread > 1e-12 * std::fabs(mean)) || !std::isfinite(spread)) spread = 1.0;
  std::vector<double> standardised(n);
  for (size_t i = 0; i < n; ++i) standardised[i] = (scores_[i] - mean) / spread;

  bool fitted = false;
  double best_likelihood = 0.0;
  for (double signal_variance : kSignalVariances) {
    for (double length_scale : kLengthScales) {
      GaussianProcess candidate;
      if (!candidate.Fit(points_, standardised, signal_variance, length_scale, noise_ * noise_)) continue;
      if (!fitted || candidate.log_marginal_likelihood() > best_likelihood) {
        best_likelihood = candidate.log_marginal_likelihood();
        *model = candidate;
        fitted = true;
      }
    }
  }
  return fitted;
}

std::vector<std::vector<double>> BayesianOptimization::Grid() const {
  const int per_side = static_cast<int>(std::floor(std::pow(kGridPoints, 1.0 / dimensions_) + 1e-9)) + 1;
  size_t total = 1;
  for (int d = 0; d < dimensions_; ++d) total *= per_side;
  std::vector<std::vector<double>> grid;
  grid.reserve(total);
  for (size_t index = 0; index < total; ++index) {
    std::vector<double> point(dimensions_);
    size_t rest = index;
    for (int d = 0; d < dimensions_; ++d) {
      point[d] = static_cast<double>(rest % per_side) / (per_side - 1);
      rest /= per_side;
    }
    grid.push_back(std::move(point));
  }
  return grid;
}

bool BayesianOptimization::IsMeasured(const std::vector<double>& point, double radius) const {
  for (const auto& measured : points_) {
    double farthest = 0.0;
    for (int d = 0; d < dimensions_; ++d) farthest = std::max(farthest, std::fabs(measured[d] - point[d]));
    if (farthest < radius) return true;
  }
  return false;
}

size_t BayesianOptimization::BestSample() const {
  GaussianProcess model;
  if (!FitModel(&model)) {
    size_t best = 0;
    for (size_t i = 1; i < scores_.size(); ++i) {
      if (scores_[i] > scores_[best]) best = i;
    }
    return best;
  }
  size_t best = 0;
  double best_mean = 0.0;
  for (size_t i = 0; i < points_.size(); ++i) {
    double mean = 0.0, variance = 0.0;
    model.Predict(points_[i], &mean, &variance);
    if (i == 0 || mean > best_mean) {
      best_mean = mean;
      best = i;
    }
  }
  return best;
}

std::vector<double> BayesianOptimization::NextSample() const {
  GaussianProcess model;
  if (points_.empty() || !FitModel(&model)) return std::vector<double>(dimensions_, 0.5);
  double incumbent = 0.0;
  for (size_t i = 0; i < points_.size(); ++i) {
    double mean = 0.0, variance = 0.0;
    model.Predict(points_[i], &mean, &variance);
    if (i == 0 || mean > incumbent) incumbent = mean;
  }
  const std::vector<std::vector<double>> grid = Grid();
  const double spacing = grid.size() > 1 ? grid[1][0] : 1.0;
  size_t best_improvement_at = 0, most_uncertain_at = 0;
  double best_improvement = -1.0, most_uncertain = -1.0;
  for (size_t g = 0; g < grid.size(); ++g) {
    if (IsMeasured(grid[g], spacing / 2)) continue;
    double mean = 0.0, variance = 0.0;
    model.Predict(grid[g], &mean, &variance);
    const double sigma = std::sqrt(variance);
    const double gain = mean - incumbent - kExploration;
    double improvement = std::max(0.0, gain);
    if (sigma > 1e-12) {
      const double z = gain / sigma;
      improvement = gain * NormalCdf(z) + sigma * NormalPdf(z);
    }
    if (improvement > best_improvement) {
      best_improvement = improvement;
      best_improvement_at = g;
    }
    if (variance > most_uncertain) {
      most_uncertain = variance;
      most_uncertain_at = g;
    }
  }
  if (most_uncertain < 0.0) return points_.back();  // every grid point is measured already
  return grid[best_improvement > 1e-9 ? best_improvement_at : most_uncertain_at];
}

}  // namespace horo
