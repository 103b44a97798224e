// BayesianOptimization: decides where on the unit box [0, 1]^d to measure next, from the scores
// measured so far, and which measured point is best. Higher scores are better.
//
// A Gaussian process (gaussian_process.h) models the score as a smooth function of the point.
// Scores are standardised (zero mean, unit spread) before fitting, so that the noise parameter
// means the same whatever the units: noise is the standard deviation of one measurement's error
// relative to the spread of the scores (Horovod's gaussian_process_noise, default 0.8). The signal
// variance and length scale are the pair of a fixed ladder that maximises the marginal likelihood
// of the data (Horovod fits the same two by gradient descent from random starts); a fixed ladder
// keeps the result a pure function of the scores.
//
// The next point maximises the expected improvement over the best posterior mean at a measured
// point, EI(x) = (mu - best - xi) Phi(z) + sigma phi(z) with z = (mu - best - xi) / sigma, taken
// over a regular grid that includes the faces and corners of the box (optima of the autotuner's
// knobs often sit on a bound: no batching delay, the largest buffer). Grid points already measured
// are skipped: with noisy scores the model keeps some doubt about its best point, and spending the
// few samples there again teaches less than measuring next to it. When the model expects no
// improvement anywhere, the point it knows least about is measured instead. Ties go to the first
// grid point, so the same scores always give the same sequence of points.
//
// The best measured point is the one with the highest posterior mean, not the highest raw score:
// with noisy measurements, the highest raw score is as often a lucky draw as a good setting.
#pragma once

#include <cstddef>
#include <vector>

#include "tuning/gaussian_process.h"

namespace horo {

class BayesianOptimization {
 public:
  BayesianOptimization(int dimensions, double noise);

  // Records the score measured at point (coordinates in [0, 1]).
  void AddSample(const std::vector<double>& point, double score);
  // The point to measure next; the centre of the box before any sample.
  std::vector<double> NextSample() const;
  // Index of the measured point with the highest posterior mean. Requires size() > 0.
  size_t BestSample() const;

  size_t size() const { return points_.size(); }
  const std::vector<double>& point(size_t i) const { return points_[i]; }
  double score(size_t i) const { return scores_[i]; }

 private:
  // Fits the model to the standardised scores; false only if no length scale could be fitted.
  bool FitModel(GaussianProcess* model) const;
  std::vector<std::vector<double>> Grid() const;
  // Whether a measured point lies within radius of point (in every coordinate).
  bool IsMeasured(const std::vector<double>& point, double radius) const;

  int dimensions_;
  double noise_;
  std::vector<std::vector<double>> points_;
  std::vector<double> scores_;
};

}  // namespace horo
