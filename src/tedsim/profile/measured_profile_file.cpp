// The profile file: strict JSON reading (every unknown key an InputError naming the file and the
// key path), writing with shortest round-trip doubles, and atomic saves (format in the header).
#include "tedsim/profile/measured_profile.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "tedsim/core/atomic_file.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/collective_table.hpp"

namespace tedsim {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "tedsim-profile";
constexpr int kVersion = 1;

// ---- strict reading -------------------------------------------------------------------------

class Reader {
 public:
  Reader(const json& j, std::string file, std::string path) : j_(j), file_(std::move(file)), path_(std::move(path)) {
    if (!j_.is_object()) fail("", "expected an object");
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const std::string p = key.empty() ? path_ : (path_.empty() ? key : path_ + "." + key);
    throw InputError(file_ + ": key '" + (p.empty() ? std::string("<top>") : p) + "': " + what);
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  const json& get(const std::string& key) const {
    read_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) fail(key, "missing");
    return *it;
  }
  std::string text(const std::string& key) const {
    const json& v = get(key);
    if (!v.is_string()) fail(key, "expected a string");
    return v.get<std::string>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    return has(key) ? text(key) : (read_.insert(key), fallback);
  }
  double number(const std::string& key) const {
    const json& v = get(key);
    if (!v.is_number()) fail(key, "expected a number");
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(key, "expected a finite number");
    return d;
  }
  double nonneg(const std::string& key) const {
    const double d = number(key);
    if (d < 0) {
      char got[32];
      std::snprintf(got, sizeof got, "%.3g", d);
      fail(key, std::string("expected a number >= 0, got ") + got);
    }
    return d;
  }
  std::int64_t positive_int(const std::string& key) const {
    const json& v = get(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() <= 0) fail(key, "expected a positive integer");
    return v.get<std::int64_t>();
  }
  std::int64_t positive_int(const std::string& key, std::int64_t fallback) const {
    return has(key) ? positive_int(key) : (read_.insert(key), fallback);
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = get(key);
    if (!v.is_boolean()) fail(key, "expected true or false");
    return v.get<bool>();
  }
  std::vector<std::string> strings(const std::string& key) const {
    const json& v = get(key);
    if (!v.is_array()) fail(key, "expected a list of strings");
    std::vector<std::string> out;
    for (const json& e : v) {
      if (!e.is_string()) fail(key, "expected a list of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  Reader child(const std::string& key) const { return Reader(get(key), file_, sub(key)); }
  std::string sub(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const std::string& file() const { return file_; }
  void reject_unknown_keys() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!read_.count(it.key())) fail(it.key(), "unknown key");
  }
  template <class F>
  auto parse(const std::string& key, F&& f) const {
    const std::string t = text(key);
    try {
      return f(t);
    } catch (const InputError& e) {
      fail(key, e.what());
    }
  }

 private:
  const json& j_;
  std::string file_, path_;
  mutable std::set<std::string> read_;
};

Timing read_timing(const Reader& r) {
  Timing t;
  t.min_s = r.nonneg("min");
  t.median_s = r.nonneg("median");
  t.max_s = r.nonneg("max");
  r.reject_unknown_keys();
  if (!(t.min_s <= t.median_s && t.median_s <= t.max_s)) r.fail("", "expected min <= median <= max");
  return t;
}

json timing_json(const Timing& t) { return json{{"min", t.min_s}, {"median", t.median_s}, {"max", t.max_s}}; }

template <class F>
void for_each_item(const Reader& top, const std::string& key, F&& f) {
  if (!top.has(key)) {
    top.get(key);  // "missing"
  }
  const json& list = top.get(key);
  if (!list.is_array()) top.fail(key, "expected a list");
  for (std::size_t i = 0; i < list.size(); ++i) f(Reader(list[i], top.file(), key + "[" + std::to_string(i) + "]"));
}

}  // namespace

KernelKind parse_kernel_kind(const std::string& text) {
  for (int i = 0; i < int(KernelKind::count); ++i)
    if (text == to_string(KernelKind(i))) return KernelKind(i);
  throw InputError("unknown kernel kind '" + text + "' (gating, dispatch, combine, layernorm, activation, softmax, elementwise, adam)");
}

CollectiveOp parse_collective_op(const std::string& text) {
  for (int i = 0; i < int(CollectiveOp::count); ++i)
    if (text == to_string(CollectiveOp(i))) return CollectiveOp(i);
  throw InputError("unknown collective '" + text + "' (all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, all_to_all_v)");
}

ProfileData at_spread_end(ProfileData data, SpreadEnd end) {
  const auto pick = [end](Timing& t) { t.median_s = end == SpreadEnd::fastest ? t.min_s : t.max_s; };
  for (GemmPoint& p : data.gemms) pick(p.seconds);
  for (KernelPoint& p : data.kernels) pick(p.seconds);
  for (CollectivePoint& p : data.collectives) pick(p.seconds);
  for (SkewPoint& p : data.skews) p.wait_mean_s = end == SpreadEnd::fastest ? p.wait_min_s : p.wait_max_s;
  return data;
}

std::string profile_to_json(const ProfileData& d) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  const Provenance& p = d.provenance;
  j["provenance"] = json{{"hosts", p.hosts},       {"devices", p.devices},     {"driver", p.driver},
                         {"cuda", p.cuda},         {"cublas", p.cublas},       {"nccl", p.nccl},
                         {"mpi", p.mpi},           {"cpu_model", p.cpu_model}, {"date", p.date},
                         {"tedsim_version", p.tedsim_version}, {"build_flags", p.build_flags},
                         {"backend", p.backend},   {"ranks", p.ranks},         {"ranks_per_node", p.ranks_per_node}};
  if (!d.calibration_json.empty()) {
    j["calibration"] = json::parse(d.calibration_json);
    j["calibration"]["complete"] = d.complete;
  }
  json g = json::array();
  for (const GemmPoint& x : d.gemms) {
    g.push_back(json{{"m", x.shape.m}, {"n", x.shape.n}, {"k", x.shape.k}, {"batch", x.shape.batch},
                     {"dtype", to_string(x.shape.dtype)}, {"seconds", timing_json(x.seconds)}});
    if (x.shape.grouped) g.back()["grouped"] = true;  // absent where false: older profiles read alike
  }
  j["gemm"] = g;
  json k = json::array();
  for (const KernelPoint& x : d.kernels)
    k.push_back(json{{"kind", to_string(x.kind)}, {"dtype", to_string(x.dtype)}, {"bytes", x.bytes},
                     {"seconds", timing_json(x.seconds)}});
  j["kernels"] = k;
  json c = json::array();
  for (const CollectivePoint& x : d.collectives) {
    c.push_back(json{{"op", to_string(x.op)},
                     {"dtype", to_string(x.dtype)},
                     {"ranks", x.span.ranks},
                     {"nodes", x.span.nodes},
                     {"max_ranks_per_node", x.span.max_ranks_per_node},
                     {"groups_per_node", x.span.groups_per_node},
                     {"crosses_islands", x.span.crosses_islands},
                     {"bytes", x.bytes},
                     {"seconds", timing_json(x.seconds)},
                     {"busbw_gbs", x.busbw_gbs}});
    if (x.op == CollectiveOp::all_to_all_v) c.back()["busiest_load"] = x.busiest_load;
  }
  j["collectives"] = c;
  if (!d.skews.empty()) {
    json a = json::array();
    for (const SkewPoint& x : d.skews)
      a.push_back(json{{"ranks", x.span.ranks},
                       {"nodes", x.span.nodes},
                       {"max_ranks_per_node", x.span.max_ranks_per_node},
                       {"compute_s", x.compute_s},
                       {"wait_s", {{"mean", x.wait_mean_s}, {"p90", x.wait_p90_s}, {"min", x.wait_min_s}, {"max", x.wait_max_s}}},
                       {"samples", x.samples}});
    j["arrival_skew"] = a;
  }
  if (!d.expert_shares.empty())
    j["expert_shares"] = json{{"model", d.expert_shares.model}, {"rows_per_pass", d.expert_shares.rows_per_pass}, {"passes", d.expert_shares.passes}};
  return j.dump(1) + "\n";
}

ProfileData profile_from_json(const std::string& text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // malformed, or a number out of range (1e9999)
    throw InputError(name + ": not valid JSON: " + e.what());
  }
  Reader top(j, name, "");
  if (top.text("format") != kFormat) top.fail("format", std::string("expected \"") + kFormat + "\"");
  if (top.positive_int("version") != kVersion) top.fail("version", "unsupported version (this tedsim reads 1)");
  ProfileData d;
  {
    Reader r = top.child("provenance");
    Provenance& p = d.provenance;
    p.hosts = r.strings("hosts");
    p.devices = r.strings("devices");
    p.driver = r.text("driver", "");
    p.cuda = r.text("cuda", "");
    p.cublas = r.text("cublas", "");
    p.nccl = r.text("nccl", "");
    p.mpi = r.text("mpi", "");
    p.cpu_model = r.text("cpu_model", "");
    p.date = r.text("date", "");
    p.tedsim_version = r.text("tedsim_version", "");
    p.build_flags = r.text("build_flags", "");
    p.backend = r.text("backend");
    p.ranks = int(r.positive_int("ranks"));
    p.ranks_per_node = int(r.positive_int("ranks_per_node", 1));
    r.reject_unknown_keys();
  }
  if (top.has("calibration")) {
    const json& c = top.get("calibration");
    if (!c.is_object()) top.fail("calibration", "expected an object");
    json copy = c;
    d.complete = true;
    if (copy.contains("complete")) {
      if (!copy["complete"].is_boolean()) top.fail("calibration.complete", "expected true or false");
      d.complete = copy["complete"].get<bool>();
      copy.erase("complete");
    }
    d.calibration_json = copy.dump();
  }
  const auto dtype = [](const std::string& t) { return parse_dtype(t); };
  for_each_item(top, "gemm", [&](const Reader& r) {
    GemmPoint p;
    p.shape.m = r.positive_int("m");
    p.shape.n = r.positive_int("n");
    p.shape.k = r.positive_int("k");
    p.shape.batch = r.positive_int("batch", 1);
    p.shape.dtype = r.parse("dtype", dtype);
    p.shape.grouped = r.boolean("grouped", false);
    p.seconds = read_timing(r.child("seconds"));
    r.reject_unknown_keys();
    d.gemms.push_back(p);
  });
  for_each_item(top, "kernels", [&](const Reader& r) {
    KernelPoint p;
    p.kind = r.parse("kind", parse_kernel_kind);
    p.dtype = r.parse("dtype", dtype);
    p.bytes = r.nonneg("bytes");
    p.seconds = read_timing(r.child("seconds"));
    r.reject_unknown_keys();
    d.kernels.push_back(p);
  });
  for_each_item(top, "collectives", [&](const Reader& r) {
    CollectivePoint p;
    p.op = r.parse("op", parse_collective_op);
    p.dtype = r.parse("dtype", dtype);
    p.span.ranks = int(r.positive_int("ranks"));
    p.span.nodes = int(r.positive_int("nodes"));
    p.span.max_ranks_per_node = int(r.positive_int("max_ranks_per_node"));
    p.span.groups_per_node = int(r.positive_int("groups_per_node"));
    p.span.crosses_islands = r.boolean("crosses_islands", false);
    p.bytes = r.nonneg("bytes");
    p.seconds = read_timing(r.child("seconds"));
    p.busbw_gbs = r.nonneg("busbw_gbs");
    if (p.op == CollectiveOp::all_to_all_v && r.has("busiest_load")) {
      p.busiest_load = r.number("busiest_load");
      if (!(p.busiest_load >= 1.0 && p.busiest_load <= p.span.ranks))
        r.fail("busiest_load", "expected the busiest rank's load over the mean, in [1, ranks]");
    }
    r.reject_unknown_keys();
    d.collectives.push_back(p);
  });
  if (top.has("arrival_skew"))
    for_each_item(top, "arrival_skew", [&](const Reader& r) {
      SkewPoint p;
      p.span.ranks = int(r.positive_int("ranks"));
      p.span.nodes = int(r.positive_int("nodes"));
      p.span.max_ranks_per_node = int(r.positive_int("max_ranks_per_node"));
      p.compute_s = r.nonneg("compute_s");
      const Reader w = r.child("wait_s");
      p.wait_mean_s = w.nonneg("mean");
      p.wait_p90_s = w.nonneg("p90");
      p.wait_min_s = w.nonneg("min");
      p.wait_max_s = w.nonneg("max");
      w.reject_unknown_keys();
      p.samples = int(r.positive_int("samples"));
      r.reject_unknown_keys();
      d.skews.push_back(p);
    });
  if (top.has("expert_shares")) {
    const Reader r = top.child("expert_shares");
    d.expert_shares.model = r.text("model");
    if (d.expert_shares.model.empty()) r.fail("model", "expected the name of the model whose routing was measured");
    d.expert_shares.rows_per_pass = r.positive_int("rows_per_pass");
    const json& passes = r.get("passes");
    if (!passes.is_array() || passes.empty()) r.fail("passes", "expected a non-empty list of passes, each a list of shares");
    for (std::size_t i = 0; i < passes.size(); ++i) {
      const json& row = passes[i];
      if (!row.is_array() || row.size() < 2) r.fail("passes", "pass " + std::to_string(i) + ": expected a list of every expert's share");
      std::vector<double> shares;
      for (const json& v : row) {
        if (!v.is_number()) r.fail("passes", "pass " + std::to_string(i) + ": expected numbers");
        shares.push_back(v.get<double>());
      }
      d.expert_shares.passes.push_back(std::move(shares));
    }
    const std::string problem = expert_shares_problem(d.expert_shares, d.expert_shares.experts());
    if (!problem.empty()) r.fail("passes", problem);
    r.reject_unknown_keys();
  }
  top.reject_unknown_keys();
  return d;
}

void save_profile(const std::string& path, const ProfileData& data) { write_file_atomically(path, profile_to_json(data)); }

ProfileData load_profile_data(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open profile");
  std::ostringstream ss;
  ss << in.rdbuf();
  return profile_from_json(ss.str(), path);
}
}  // namespace tedsim
