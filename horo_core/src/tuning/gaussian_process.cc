#include "tuning/gaussian_process.h"

#include <algorithm>
#include <cmath>

namespace horo {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Solves L z = b (forward substitution).
std::vector<double> ForwardSolve(const std::vector<double>& lower, int n, const std::vector<double>& b) {
  std::vector<double> z(n);
  for (int i = 0; i < n; ++i) {
    double sum = b[i];
    for (int j = 0; j < i; ++j) sum -= lower[i * n + j] * z[j];
    z[i] = sum / lower[i * n + i];
  }
  return z;
}

}  // namespace

bool CholeskyFactor(const std::vector<double>& a, int n, std::vector<double>* lower) {
  std::vector<double> l(static_cast<size_t>(n) * n, 0.0);
  for (int j = 0; j < n; ++j) {
    double diagonal = a[j * n + j];
    for (int k = 0; k < j; ++k) diagonal -= l[j * n + k] * l[j * n + k];
    if (!(diagonal > 0.0)) return false;  // also rejects NaN
    const double pivot = std::sqrt(diagonal);
    l[j * n + j] = pivot;
    for (int i = j + 1; i < n; ++i) {
      double sum = a[i * n + j];
      for (int k = 0; k < j; ++k) sum -= l[i * n + k] * l[j * n + k];
      l[i * n + j] = sum / pivot;
    }
  }
  *lower = std::move(l);
  return true;
}

std::vector<double> CholeskySolve(const std::vector<double>& lower, int n, const std::vector<double>& b) {
  std::vector<double> z = ForwardSolve(lower, n, b);
  // Back substitution with L^T: (L^T)[i][j] = L[j][i].
  std::vector<double> x(n);
  for (int i = n - 1; i >= 0; --i) {
    double sum = z[i];
    for (int j = i + 1; j < n; ++j) sum -= lower[j * n + i] * x[j];
    x[i] = sum / lower[i * n + i];
  }
  return x;
}

double GaussianProcess::Kernel(const std::vector<double>& a, const std::vector<double>& b) const {
  double squared = 0.0;
  for (size_t d = 0; d < a.size(); ++d) squared += (a[d] - b[d]) * (a[d] - b[d]);
  return signal_variance_ * std::exp(-squared / (2.0 * length_scale_ * length_scale_));
}

bool GaussianProcess::Fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                          double signal_variance, double length_scale, double noise_variance) {
  const int n = static_cast<int>(x.size());
  if (n == 0 || y.size() != x.size() || !(signal_variance > 0.0) || !(length_scale > 0.0) ||
      !(noise_variance >= 0.0)) {
    return false;
  }
  for (const auto& point : x) {
    if (point.size() != x[0].size()) return false;
  }
  x_ = x;
  signal_variance_ = signal_variance;
  length_scale_ = length_scale;
  std::vector<double> covariance(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) covariance[i * n + j] = Kernel(x[i], x[j]);
  }
  // A tiny jitter keeps the factorisation stable when two points coincide and the noise is 0;
  // grow it only if that is not enough.
  bool factored = false;
  for (double jitter = 1e-9; jitter < 1e-2 && !factored; jitter *= 100) {
    std::vector<double> a = covariance;
    for (int i = 0; i < n; ++i) a[i * n + i] += noise_variance + jitter;
    factored = CholeskyFactor(a, n, &lower_);
  }
  if (!factored) return false;
  alpha_ = CholeskySolve(lower_, n, y);
  double fit = 0.0;
  double log_det = 0.0;
  for (int i = 0; i < n; ++i) {
    fit += y[i] * alpha_[i];
    log_det += std::log(lower_[i * n + i]);
  }
  log_marginal_likelihood_ = -0.5 * fit - log_det - 0.5 * n * std::log(2.0 * kPi);
  return true;
}

void GaussianProcess::Predict(const std::vector<double>& at, double* mean, double* variance) const {
  const int n = static_cast<int>(x_.size());
  std::vector<double> k(n);
  double m = 0.0;
  for (int i = 0; i < n; ++i) {
    k[i] = Kernel(x_[i], at);
    m += k[i] * alpha_[i];
  }
  const std::vector<double> v = ForwardSolve(lower_, n, k);  // k^T (L L^T)^-1 k = |L^-1 k|^2
  double explained = 0.0;
  for (double e : v) explained += e * e;
  *mean = m;
  *variance = std::max(0.0, signal_variance_ - explained);
}

}  // namespace horo
