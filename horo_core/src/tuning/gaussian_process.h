// GaussianProcess: Gaussian-process regression with a squared-exponential kernel, the surrogate
// model of the autotuner's Bayesian optimisation.
//
// The model says that scores measured at nearby settings are similar: the prior covariance of
// the scores at points a and b is s exp(-|a - b|^2 / (2 l^2)) (signal variance s, length scale
// l), and every measurement carries independent Gaussian noise of variance noise_variance. Given
// n measured points X with values y, the posterior at a point x has
//
//   mean     = k(x)^T (K + noise I)^-1 y
//   variance = s - k(x)^T (K + noise I)^-1 k(x)
//
// where K = k(X, X) and k(x) = k(X, x). We factor K + noise I = L L^T once (Cholesky), keep
// alpha = (K + noise I)^-1 y, and answer every prediction with one triangular solve. The log
// marginal likelihood -y^T alpha / 2 - sum(log L_ii) - n log(2 pi) / 2 tells how well (s, l)
// explain the data; the optimiser uses it to choose them. A few dozen points cost microseconds.
#pragma once

#include <vector>

namespace horo {

class GaussianProcess {
 public:
  // Fits the posterior to points x (all of the same dimension) and values y. Returns false if
  // the inputs are empty or inconsistent, or the covariance cannot be factored.
  bool Fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y, double signal_variance,
           double length_scale, double noise_variance);

  // Posterior mean and variance of the (noise-free) score at one point.
  void Predict(const std::vector<double>& at, double* mean, double* variance) const;

  double log_marginal_likelihood() const { return log_marginal_likelihood_; }

 private:
  double Kernel(const std::vector<double>& a, const std::vector<double>& b) const;

  std::vector<std::vector<double>> x_;
  double signal_variance_ = 1.0;
  double length_scale_ = 1.0;
  std::vector<double> lower_;  // Cholesky factor L, row-major n x n
  std::vector<double> alpha_;  // (K + noise I)^-1 y
  double log_marginal_likelihood_ = 0.0;
};

// Factors the symmetric positive definite n x n matrix a (row-major) as L L^T and stores L in
// lower (row-major, zeros above the diagonal). Returns false if a is not positive definite.
bool CholeskyFactor(const std::vector<double>& a, int n, std::vector<double>* lower);

// Solves L L^T x = b for x, given the factor from CholeskyFactor.
std::vector<double> CholeskySolve(const std::vector<double>& lower, int n, const std::vector<double>& b);

}  // namespace horo
