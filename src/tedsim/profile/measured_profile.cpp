// Lookups of a measured profile (the file format: measured_profile_file.cpp).
#include "tedsim/profile/measured_profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "tedsim/core/error.hpp"
#include "tedsim/profile/collective_table.hpp"

namespace tedsim {

namespace {

std::string human_bytes(double b) {
  char buf[64];
  if (b >= kGiB) std::snprintf(buf, sizeof buf, "%.3g GiB", b / kGiB);
  else if (b >= kMiB) std::snprintf(buf, sizeof buf, "%.3g MiB", b / kMiB);
  else if (b >= kKiB) std::snprintf(buf, sizeof buf, "%.3g KiB", b / kKiB);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string num(double v, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
}  // namespace

std::string describe_span(const GroupSpan& s) {
  std::string out = "n=" + std::to_string(s.ranks) + " nodes=" + std::to_string(s.nodes) +
                    " rpn=" + std::to_string(s.max_ranks_per_node) + " gpn=" + std::to_string(s.groups_per_node);
  if (s.crosses_islands) out += " islands";
  return out;
}

std::string point_key(const GemmPoint& p) {
  return "gemm " + std::to_string(p.shape.m) + "x" + std::to_string(p.shape.n) + "x" + std::to_string(p.shape.k) +
         " batch " + std::to_string(p.shape.batch) + (p.shape.grouped ? " grouped " : " ") + to_string(p.shape.dtype);
}
std::string point_key(const KernelPoint& p) {
  return std::string("kernel ") + to_string(p.kind) + " " + to_string(p.dtype) + " " + num(p.bytes, 17);
}
std::string point_key(const CollectivePoint& p) {
  return std::string("collective ") + to_string(p.op) + " " + to_string(p.dtype) + " " + describe_span(p.span) + " " +
         num(p.bytes, 17);
}

// ---- lookups ----------------------------------------------------------------------------------

MeasuredProfile::MeasuredProfile(ProfileData data, const TopologySpec& fallback_topology, std::string source)
    : data_(std::move(data)), fallback_(fallback_topology), source_(std::move(source)) {
  std::map<std::tuple<int, int>, std::vector<std::pair<double, double>>> k;
  for (const KernelPoint& p : data_.kernels)
    if (p.bytes > 0 && p.seconds.median_s > 0) k[{int(p.kind), int(p.dtype)}].push_back({p.bytes, p.seconds.median_s});
  std::map<std::tuple<int, int, int, int, int, bool>, std::vector<std::pair<double, double>>> c;
  for (const CollectivePoint& p : data_.collectives)
    if (p.bytes > 0 && p.seconds.median_s > 0)
      c[{int(p.op), p.span.ranks, p.span.nodes, p.span.max_ranks_per_node, p.span.groups_per_node,
         p.span.crosses_islands}]
          .push_back({p.bytes, p.seconds.median_s});
  const auto build = [](std::vector<std::pair<double, double>>& pts) {
    std::sort(pts.begin(), pts.end());
    Series s;
    // Points measured more than once at one size (merged profiles): the median of their times.
    for (std::size_t i = 0; i < pts.size();) {
      std::size_t j = i;
      while (j < pts.size() && pts[j].first == pts[i].first) ++j;
      const std::size_t n = j - i, mid = i + n / 2;  // times are sorted within a size
      s.bytes.push_back(pts[i].first);
      s.seconds.push_back(n % 2 ? pts[mid].second : 0.5 * (pts[mid - 1].second + pts[mid].second));
      i = j;
    }
    fit(s);
    return s;
  };
  for (auto& [key, pts] : k) kernels_[key] = build(pts);
  for (auto& [key, pts] : c) collectives_[key] = build(pts);
  for (const SkewPoint& p : data_.skews) skews_[{p.span.ranks, p.span.nodes}].push_back({p.compute_s, p.wait_mean_s});
  for (auto& [key, pts] : skews_) std::sort(pts.begin(), pts.end());
  for (const CollectivePoint& p : data_.collectives) {
    multi_rank_ = multi_rank_ || p.span.ranks > 1;
    has_send_recv_ = has_send_recv_ || p.op == CollectiveOp::send_recv;
    has_all_to_all_v_ = has_all_to_all_v_ || p.op == CollectiveOp::all_to_all_v;
  }
  for (std::size_t i = 0; i < data_.gemms.size(); ++i)
    if (data_.gemms[i].seconds.median_s > 0) gemms_by_dtype_[int(data_.gemms[i].shape.dtype)].push_back(i);
}

// Least squares of t = alpha + bytes * inv_bw in relative error (weights 1/t^2), so the small
// (latency-bound) sizes count as much as the large ones; both coefficients kept >= 0.
void MeasuredProfile::fit(Series& s) {
  const std::size_t n = s.bytes.size();
  if (n == 0) return;
  if (n == 1) {
    s.alpha = 0;
    s.inv_bw = s.seconds[0] / s.bytes[0];
    return;
  }
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double w = 1.0 / (s.seconds[i] * s.seconds[i]);
    sw += w;
    sx += w * s.bytes[i];
    sy += w * s.seconds[i];
    sxx += w * s.bytes[i] * s.bytes[i];
    sxy += w * s.bytes[i] * s.seconds[i];
  }
  const double det = sw * sxx - sx * sx;
  double a = det != 0 ? (sxx * sy - sx * sxy) / det : 0;
  double b = det != 0 ? (sw * sxy - sx * sy) / det : 0;
  if (a < 0 || det == 0) {  // through the origin
    a = 0;
    b = sxy / sxx;
  }
  if (b <= 0) {  // flat: pure latency; eval scales from the largest point above the range
    b = 0;
    a = sy / sw;
  }
  s.alpha = a;
  s.inv_bw = b;
}

double MeasuredProfile::eval(const Series& s, double bytes, int* where) {
  const std::size_t n = s.bytes.size();
  if (bytes < s.bytes.front()) {
    // Below the range: the fit, never slower than the smallest measured point, and never at a
    // higher rate (bytes/s) than it (a fit through the origin would otherwise lose the latency).
    *where = -1;
    const double t = s.alpha + bytes * s.inv_bw;
    return std::min(std::max(t, s.seconds.front() * bytes / s.bytes.front()), s.seconds.front());
  }
  if (bytes > s.bytes.back()) {
    // Above the range: the fit, never faster than the largest measured point (a fit in relative
    // error may pass below it). A flat fit (every point latency-bound) has no bandwidth to go on:
    // the time then grows linearly from the largest point, at that point's rate.
    *where = 1;
    if (s.inv_bw <= 0) return s.seconds.back() * bytes / s.bytes.back();
    return std::max(s.alpha + bytes * s.inv_bw, s.seconds.back());
  }
  *where = 0;
  const auto it = std::lower_bound(s.bytes.begin(), s.bytes.end(), bytes);
  const std::size_t hi = std::size_t(it - s.bytes.begin());
  if (s.bytes[hi] == bytes || n == 1) return s.seconds[hi];
  const std::size_t lo = hi - 1;
  const double f = std::log(bytes / s.bytes[lo]) / std::log(s.bytes[hi] / s.bytes[lo]);
  return std::exp(std::log(s.seconds[lo]) + f * (std::log(s.seconds[hi]) - std::log(s.seconds[lo])));
}

void MeasuredProfile::note(const std::string& key, const std::string& text, double size, SizeUnit unit,
                           double value, const char* value_unit) const {
  // Called with mutex_ held.
  departed_ = true;
  auto it = warning_index_.find(key);
  if (it == warning_index_.end()) {
    warning_index_[key] = warnings_.size();
    warnings_.push_back(Warning{text, far_, 1, size, size, unit, value, value, value_unit ? value_unit : ""});
    return;
  }
  Warning& w = warnings_[it->second];
  w.far = w.far || far_;
  ++w.count;
  w.min_size = std::min(w.min_size, size);
  w.max_size = std::max(w.max_size, size);
  w.min_value = std::min(w.min_value, value);
  w.max_value = std::max(w.max_value, value);
}

std::vector<std::string> MeasuredProfile::warnings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  // "lo..hi" (or one value when both print the same) of a quantity.
  const auto range = [](const std::string& lo, const std::string& hi) { return lo == hi ? lo : lo + ".." + hi; };
  for (const Warning& w : warnings_) {
    std::string line = (w.far ? "far: " : "") + w.text;
    if (!w.value_unit.empty()) line += " (" + range(num(w.min_value), num(w.max_value)) + " " + w.value_unit + ")";
    line += " [asked " + (w.unit == SizeUnit::bytes ? range(human_bytes(w.min_size), human_bytes(w.max_size))
                          : w.unit == SizeUnit::flop ? range(num(w.min_size), num(w.max_size)) + " FLOP"
                                                     : range(num(w.min_size * 1e3), num(w.max_size * 1e3)) + " ms of compute");
    if (w.count > 1) line += ", " + std::to_string(w.count) + " distinct lookups";
    out.push_back(line + "]");
  }
  return out;
}

namespace {
template <class... T>
std::string raw_key(char tag, const T&... v) {
  std::string k(1, tag);
  (k.append(reinterpret_cast<const char*>(&v), sizeof(v)), ...);
  return k;
}
}  // namespace

template <class Compute>
MeasuredProfile::Answer MeasuredProfile::answer(const std::string& key, Compute&& uncached) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  far_ = departed_ = false;
  const double t = uncached();
  const Answer a{t, far_, departed_};
  far_ = departed_ = false;
  cache_.emplace(key, a);
  return a;
}

MeasuredProfile::Answer MeasuredProfile::gemm_answer(const GemmShape& s) const {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0) return {0.0, false, false};
  return answer(raw_key('g', s.m, s.n, s.k, s.batch, s.dtype, s.grouped), [&] { return gemm_uncached(s); });
}

MeasuredProfile::Answer MeasuredProfile::kernel_answer(KernelKind kind, double bytes, Dtype dtype) const {
  if (bytes <= 0) return {0.0, false, false};
  return answer(raw_key('k', kind, bytes, dtype), [&] { return kernel_uncached(kind, bytes, dtype); });
}

MeasuredProfile::Answer MeasuredProfile::collective_answer(CollectiveOp op, const GroupSpan& span, double bytes) const {
  if (span.ranks <= 1 || bytes <= 0) return {0.0, false, false};
  return answer(raw_key('c', op, span.ranks, span.nodes, span.max_ranks_per_node, span.groups_per_node,
                        span.crosses_islands, bytes),
                [&] { return collective_uncached(op, span, bytes); });
}

double MeasuredProfile::gemm_seconds(const GemmShape& s) const { return gemm_answer(s).seconds; }
bool MeasuredProfile::far_outside(const GemmShape& s) const { return gemm_answer(s).far; }
double MeasuredProfile::kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const {
  return kernel_answer(kind, bytes, dtype).seconds;
}
bool MeasuredProfile::far_outside(KernelKind kind, double bytes, Dtype dtype) const {
  return kernel_answer(kind, bytes, dtype).far;
}
bool MeasuredProfile::departs(KernelKind kind, double bytes, Dtype dtype) const {
  return kernel_answer(kind, bytes, dtype).departed;
}
double MeasuredProfile::collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const {
  return collective_answer(op, span, bytes).seconds;
}
bool MeasuredProfile::far_outside(CollectiveOp op, const GroupSpan& span, double bytes) const {
  return collective_answer(op, span, bytes).far;
}
bool MeasuredProfile::departs(CollectiveOp op, const GroupSpan& span, double bytes) const {
  return collective_answer(op, span, bytes).departed;
}

// The pipeline's exchange is measured as the send_recv collective on the pipeline groups. A
// profile without any (single-stage calibration, or made before tedsim measured it) says so once.
double MeasuredProfile::p2p_seconds(const GroupSpan& span, double bytes) const {
  if (has_send_recv_) return collective_seconds(CollectiveOp::send_recv, span, bytes);
  std::lock_guard<std::mutex> lock(mutex_);  // note() needs it: the search calls from many threads
  note(std::string("p2p ") + (span.nodes > 1 ? "inter" : "intra"),
       std::string("p2p ") + (span.nodes > 1 ? "across nodes" : "inside a node") +
           ": not in this profile (calibrate on two or more ranks measures it), analytic profile of the fallback "
           "topology used",
       bytes);
  return fallback_.p2p_seconds(span, bytes);
}

double MeasuredProfile::arrival_wait_seconds(const GroupSpan& span, double compute_s) const {
  if (span.ranks <= 1 || compute_s <= 0) return 0;
  auto it = skews_.find({span.ranks, span.nodes});
  // Built only for a warning: the timeline asks this once per collective of every pass.
  const auto name = [&span] {
    return "arrival wait on " + std::to_string(span.ranks) + " ranks, " + std::to_string(span.nodes) +
           (span.nodes == 1 ? " node" : " nodes");
  };
  if (it == skews_.end()) {
    if (skews_.empty()) {
      if (multi_rank_) {
        std::lock_guard<std::mutex> lock(mutex_);  // note() needs it: the search calls from many threads
        far_ = false;
        note("skew-none", "arrival skew: not in this profile (calibrated before tedsim measured it): blocking "
                          "collectives assume their ranks arrive together; calibrate again to measure it",
             compute_s, SizeUnit::seconds);
      }
      return 0;
    }
    // The nearest measured shape: same node count first, then closest rank count.
    double best = std::numeric_limits<double>::max();
    for (auto c = skews_.begin(); c != skews_.end(); ++c) {
      const double d = 100.0 * std::abs(std::log(double(c->first.second) / span.nodes)) +
                       std::abs(std::log(double(c->first.first) / span.ranks));
      if (d < best) best = d, it = c;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    far_ = false;
    note("skew-shape " + name(), name() + ": group shape never measured, used the one measured on " +
                                   std::to_string(it->first.first) + " ranks, " + std::to_string(it->first.second) +
                                   " node(s)",
         compute_s, SizeUnit::seconds);
  }
  const std::vector<std::pair<double, double>>& pts = it->second;
  double x0 = 0, y0 = 0;  // no compute since the group met: no skew
  for (const auto& [x, y] : pts) {
    if (compute_s <= x) return x > x0 ? y0 + (y - y0) * (compute_s - x0) / (x - x0) : y;
    x0 = x, y0 = y;
  }
  if (compute_s > kFarFactor * x0) {
    std::lock_guard<std::mutex> lock(mutex_);
    far_ = false;
    note("skew-range " + name(), name() + ": compute segments above the longest measured (" + num(x0 * 1e3) +
                                   " ms), wait scaled in proportion to the segment",
         compute_s, SizeUnit::seconds);
  }
  return x0 > 0 ? y0 * compute_s / x0 : 0;
}

double MeasuredProfile::gemm_uncached(const GemmShape& s) const {
  const std::string what = std::string("gemm ") + to_string(s.dtype);
  auto by = gemms_by_dtype_.find(int(s.dtype));
  if (by == gemms_by_dtype_.end()) {
    // Another dtype's points (e.g. a CPU profile, fp32 only, asked about a bf16 model).
    for (const auto& [dt, list] : gemms_by_dtype_) {
      note("gemm-dtype " + std::string(to_string(s.dtype)),
           what + ": no " + to_string(s.dtype) + " GEMMs measured, used the " + to_string(Dtype(dt)) + " points", s.flops(),
           SizeUnit::flop);
      by = gemms_by_dtype_.find(dt);
      break;
    }
  }
  if (by == gemms_by_dtype_.end()) {
    note("gemm-none", "gemm: no GEMMs measured, analytic profile of the fallback topology used", s.flops(), SizeUnit::flop);
    return fallback_.gemm_seconds(s);
  }
  // Local linear fit of log(time) over (log m, log n, log k, log batch) on the nearest measured
  // shapes (weighted by closeness, a small ridge keeps directions without spread flat): between
  // grid points a GEMM's time is close to log-linear in each dimension, which a plane captures.
  struct Near {
    double dist;
    double x[4];
    double log_t;
  };
  const double q[4] = {std::log(double(s.m)), std::log(double(s.n)), std::log(double(s.k)), std::log(double(s.batch))};
  // A grouped GEMM fits on the grouped points and any other GEMM on the rest (GemmShape::grouped),
  // where the profile has points of its kind; a profile written before grouped GEMMs were timed
  // apart has none, and serves both from all its points.
  const bool same_kind_only = std::any_of(by->second.begin(), by->second.end(),
                                          [&](std::size_t i) { return data_.gemms[i].shape.grouped == s.grouped; });
  std::vector<Near> near;
  double min_flops = std::numeric_limits<double>::max(), max_flops = 0;
  for (std::size_t i : by->second) {
    const GemmPoint& p = data_.gemms[i];
    if (same_kind_only && p.shape.grouped != s.grouped) continue;
    Near n{0, {std::log(double(p.shape.m)) - q[0], std::log(double(p.shape.n)) - q[1], std::log(double(p.shape.k)) - q[2],
               std::log(double(p.shape.batch)) - q[3]},
           std::log(p.seconds.median_s)};
    n.dist = std::abs(n.x[0]) + std::abs(n.x[1]) + std::abs(n.x[2]) + std::abs(n.x[3]);
    if (n.dist == 0) return p.seconds.median_s;
    near.push_back(n);
    min_flops = std::min(min_flops, p.shape.flops());
    max_flops = std::max(max_flops, p.shape.flops());
  }
  const std::size_t k = std::min<std::size_t>(16, near.size());
  std::partial_sort(near.begin(), near.begin() + k, near.end(), [](const Near& a, const Near& b) { return a.dist < b.dist; });
  // Normal equations of weighted least squares, unknowns (c, g0..g3): log t = c + g . x.
  double A[5][6] = {};
  for (std::size_t i = 0; i < k; ++i) {
    const double w = 1.0 / (near[i].dist * near[i].dist);
    const double f[5] = {1.0, near[i].x[0], near[i].x[1], near[i].x[2], near[i].x[3]};
    for (int r = 0; r < 5; ++r) {
      for (int c = 0; c < 5; ++c) A[r][c] += w * f[r] * f[c];
      A[r][5] += w * f[r] * near[i].log_t;
    }
  }
  double wmax = 0;
  for (int r = 0; r < 5; ++r) wmax = std::max(wmax, A[r][r]);
  for (int r = 1; r < 5; ++r) A[r][r] += 1e-6 * wmax;
  bool ok = true;
  for (int c = 0; c < 5 && ok; ++c) {  // Gaussian elimination, partial pivoting
    int piv = c;
    for (int r = c + 1; r < 5; ++r)
      if (std::abs(A[r][c]) > std::abs(A[piv][c])) piv = r;
    if (std::abs(A[piv][c]) < 1e-300) {
      ok = false;
      break;
    }
    std::swap(A[c], A[piv]);
    for (int r = 0; r < 5; ++r) {
      if (r == c) continue;
      const double f = A[r][c] / A[c][c];
      for (int cc = c; cc < 6; ++cc) A[r][cc] -= f * A[c][cc];
    }
  }
  double log_t = ok ? A[0][5] / A[0][0] : near[0].log_t;
  // Never outside the neighbours' efficiency range: a plane may tilt too far beyond its points.
  // x sums to log(flops_i / flops_q), so pe = exp(sum x - log t_i) = (flops_i / t_i) / flops_q: a
  // neighbour's FLOP/s over the query's FLOP, i.e. the 1/t the query would have at that
  // neighbour's efficiency. 1/t_q stays within [min pe, max pe].
  double eff_lo = std::numeric_limits<double>::max(), eff_hi = 0;
  for (std::size_t i = 0; i < k; ++i) {
    const double pe = std::exp(near[i].x[0] + near[i].x[1] + near[i].x[2] + near[i].x[3] - near[i].log_t);
    eff_lo = std::min(eff_lo, pe);
    eff_hi = std::max(eff_hi, pe);
  }
  log_t = std::min(std::max(log_t, -std::log(eff_hi)), -std::log(eff_lo));
  const double eff = s.flops() / std::exp(log_t);
  const double flops = s.flops();
  if (flops > 2.0 * max_flops || flops < 0.5 * min_flops) {
    far_ = flops > kFarFactor * max_flops || flops < min_flops / kFarFactor;
    note(std::string("gemm-range ") + to_string(s.dtype) + (flops > max_flops ? "+" : "-"),
         what + ": " + (flops > max_flops ? "above" : "below") + " the measured range " + num(min_flops) + ".." +
             num(max_flops) + " FLOP, local fit on the " + std::to_string(k) + " nearest measured shapes, extrapolated",
         flops, SizeUnit::flop, eff / 1e9, "GFLOP/s");
  }
  return flops / eff;
}

// How a series answers outside its range, for the warnings (times multiplied by `scale`).
std::string MeasuredProfile::fit_text(const Series& s, double scale, const char* bandwidth) {
  const std::string points = std::to_string(s.bytes.size()) + " point" + (s.bytes.size() == 1 ? "" : "s");
  if (s.inv_bw <= 0) {
    return "flat alpha-beta fit of " + points + " (" + num(s.alpha * scale * 1e6) +
           " us; above it, linear from the largest point at " +
           num(s.bytes.back() / (s.seconds.back() * scale) / kGB) + " " + bandwidth + ")";
  }
  return "alpha-beta fit of " + points + " (" + num(s.alpha * scale * 1e6) + " us + " +
         num(1.0 / (s.inv_bw * scale) / kGB) + " " + bandwidth + ")";
}

double MeasuredProfile::kernel_uncached(KernelKind kind, double bytes, Dtype dtype) const {
  auto it = kernels_.find({int(kind), int(dtype)});
  if (it == kernels_.end()) {
    for (int dt = 0; dt < 3; ++dt) {
      auto other = kernels_.find({int(kind), dt});
      if (other == kernels_.end()) continue;
      note(std::string("kernel-dtype ") + to_string(kind) + to_string(dtype),
           std::string("kernel ") + to_string(kind) + " " + to_string(dtype) + ": not measured, used the " +
               to_string(Dtype(dt)) + " points (same bytes)",
           bytes);
      it = other;
      break;
    }
  }
  if (it == kernels_.end()) {
    note(std::string("kernel-none ") + to_string(kind),
         std::string("kernel ") + to_string(kind) + ": not measured, analytic profile of the fallback topology used", bytes);
    return fallback_.kernel_seconds(kind, bytes, dtype);
  }
  int where = 0;
  const Series& s = it->second;
  const double t = eval(s, bytes, &where);
  far_ = bytes > kFarFactor * s.bytes.back() || bytes < s.bytes.front() / kFarFactor;
  if (where != 0)
    note(std::string("kernel-range ") + to_string(kind) + to_string(dtype) + (where > 0 ? "+" : "-"),
         std::string("kernel ") + to_string(kind) + " " + to_string(dtype) + ": sizes " + (where > 0 ? "above" : "below") +
             " the measured " + human_bytes(s.bytes.front()) + ".." + human_bytes(s.bytes.back()) + ", " + fit_text(s, 1.0, "GB/s"),
         bytes);
  return t;
}

double MeasuredProfile::collective_uncached(CollectiveOp op, const GroupSpan& span, double bytes) const {
  if (op == CollectiveOp::all_to_all_v && !has_all_to_all_v_) {
    note("a2av-none", "all_to_all_v: not in this profile (calibrated before tedsim measured it, or for a model that is not "
                      "dropless): priced as the even all_to_all of the busiest rank's size",
         bytes);
    return collective_uncached(CollectiveOp::all_to_all, span, bytes);
  }
  const std::string name = std::string(to_string(op)) + " on " + describe_span(span);
  auto it = collectives_.find({int(op), span.ranks, span.nodes, span.max_ranks_per_node, span.groups_per_node,
                               span.crosses_islands});
  double scale = 1.0;
  if (it == collectives_.end()) {
    // Nearest measured shape of this op: same node count first, then closest ranks, groups/node.
    double best = std::numeric_limits<double>::max();
    for (auto c = collectives_.begin(); c != collectives_.end(); ++c) {
      const auto& [o, ranks, nodes, rpn, gpn, islands] = c->first;
      if (o != int(op)) continue;
      const double d = 100.0 * std::abs(std::log(double(nodes) / span.nodes)) +
                       10.0 * std::abs(std::log(double(ranks) / span.ranks)) +
                       std::abs(std::log(double(gpn) / span.groups_per_node)) +
                       std::abs(std::log(double(rpn) / span.max_ranks_per_node)) + (islands != span.crosses_islands);
      if (d < best) {
        best = d;
        it = c;
      }
    }
    if (it == collectives_.end()) {
      note(std::string("coll-none ") + to_string(op),
           std::string(to_string(op)) + ": never measured, analytic profile of the fallback topology used", bytes);
      return fallback_.collective_seconds(op, span, bytes);
    }
    const auto& [o, ranks, nodes, rpn, gpn, islands] = it->first;
    (void)o;
    const double f_measured = bus_bandwidth_factor(op, ranks);
    scale = f_measured > 0 ? bus_bandwidth_factor(op, span.ranks) / f_measured : 1.0;
    GroupSpan from{ranks, nodes, rpn, gpn, islands};
    note("coll-shape " + name,
         name + ": group shape never measured, used " + describe_span(from) + " scaled by the busbw factor ratio " +
             num(scale),
         bytes);
  }
  int where = 0;
  const Series& s = it->second;
  const double t = eval(s, bytes, &where) * scale;
  far_ = bytes > kFarFactor * s.bytes.back() || bytes < s.bytes.front() / kFarFactor;
  if (where != 0)
    note("coll-range " + name + (where > 0 ? "+" : "-"),
         name + ": sizes " + (where > 0 ? "above" : "below") + " the measured " + human_bytes(s.bytes.front()) + ".." +
             human_bytes(s.bytes.back()) + ", " + fit_text(s, scale, "GB/s algbw") +
             (scale != 1.0 ? ", the borrowed shape's fit scaled" : ""),
         bytes);
  return t;
}

std::string MeasuredProfile::describe() const {
  const Provenance& p = data_.provenance;
  std::string hosts = p.hosts.empty() ? "?" : p.hosts.front();
  if (p.hosts.size() > 1) hosts += " +" + std::to_string(p.hosts.size() - 1);
  return "measured (" + (source_.empty() ? std::string("in memory") : source_) + ": " + p.backend + ", " +
         std::to_string(p.ranks) + " ranks on " + hosts + ", " + (p.devices.empty() ? "?" : p.devices.front()) + ", " +
         p.date + "; " + std::to_string(data_.gemms.size()) + " GEMM, " + std::to_string(data_.kernels.size()) +
         " kernel, " + std::to_string(data_.collectives.size()) + " collective points; " +
         (data_.complete ? "" : "INCOMPLETE, ") + "else " + fallback_.describe() + ")";
}

std::unique_ptr<Profile> load_profile(const std::string& path, const TopologySpec& fallback_topology) {
  ProfileData data = load_profile_data(path);
  return std::make_unique<MeasuredProfile>(std::move(data), fallback_topology, path);
}

void print_profile_warnings(std::ostream& out, const Profile& profile, int max_lines) {
  const auto* measured = dynamic_cast<const MeasuredProfile*>(&profile);
  if (!measured) return;
  const std::vector<std::string> w = measured->warnings();
  if (w.empty()) return;
  out << "profile: " << w.size() << " lookup" << (w.size() == 1 ? "" : "s") << " not answered by a measured point:\n";
  for (std::size_t i = 0; i < w.size() && int(i) < max_lines; ++i) out << "  " << w[i] << '\n';
  if (int(w.size()) > max_lines) out << "  ... and " << (w.size() - std::size_t(max_lines)) << " more\n";
}

}  // namespace tedsim
