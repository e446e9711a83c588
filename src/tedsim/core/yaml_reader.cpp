#include "tedsim/core/yaml_reader.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

std::string mark_text(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

YAML::Node parse(const std::string& text, const std::string& name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw InputError(mark_text(name, e.mark) + ": malformed YAML: " + e.msg);
  }
}

}  // namespace

YamlMap YamlMap::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_string(buffer.str(), path);
}

YamlMap YamlMap::from_string(const std::string& text, const std::string& name) {
  YAML::Node root = parse(text, name);
  if (!root.IsMap()) throw InputError(name + ": expected a YAML mapping at the top level");
  return YamlMap(root, name, "");
}

YamlMap::YamlMap(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

std::string YamlMap::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::string YamlMap::where(const std::string& key) const {
  YAML::Node v = node_[key];
  const YAML::Mark mark = v.IsDefined() ? v.Mark() : node_.Mark();
  return mark_text(file_, mark) + ": key '" + key_path(key) + "'";
}

void YamlMap::fail(const std::string& key, const std::string& what) const {
  throw InputError(where(key) + ": " + what);
}

bool YamlMap::has(const std::string& key) const {
  read_.insert(key);
  return node_[key].IsDefined() && !node_[key].IsNull();
}

YAML::Node YamlMap::value(const std::string& key) const {
  read_.insert(key);
  YAML::Node v = node_[key];
  if (!v.IsDefined() || v.IsNull()) fail(key, "missing (required)");
  return v;
}

YamlMap YamlMap::child(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsMap()) fail(key, "expected a mapping");
  return YamlMap(v, file_, key_path(key));
}

std::int64_t YamlMap::integer(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsScalar()) fail(key, "expected an integer");
  try {
    return v.as<std::int64_t>();
  } catch (const YAML::Exception&) {
    fail(key, "expected an integer, got '" + v.Scalar() + "'");
  }
}

std::int64_t YamlMap::integer(const std::string& key, std::int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double YamlMap::number(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsScalar()) fail(key, "expected a number");
  double x = 0;
  try {
    x = v.as<double>();
  } catch (const YAML::Exception&) {
    fail(key, "expected a number, got '" + v.Scalar() + "'");
  }
  if (!std::isfinite(x)) fail(key, "expected a finite number, got '" + v.Scalar() + "'");
  return x;
}

double YamlMap::number(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

bool YamlMap::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  YAML::Node v = value(key);
  try {
    if (v.IsScalar()) return v.as<bool>();
  } catch (const YAML::Exception&) {
  }
  fail(key, "expected true or false, got '" + (v.IsScalar() ? v.Scalar() : std::string("a non-scalar")) + "'");
}

std::string YamlMap::text(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsScalar()) fail(key, "expected a string");
  return v.Scalar();
}

std::string YamlMap::text(const std::string& key, const std::string& fallback) const {
  return has(key) ? text(key) : fallback;
}

std::vector<std::pair<double, double>> YamlMap::curve(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsSequence() || v.size() == 0) fail(key, "expected a non-empty list of [x, y] pairs");
  std::vector<std::pair<double, double>> points;
  for (const YAML::Node& p : v) {
    if (!p.IsSequence() || p.size() != 2) fail(key, "expected each entry to be a pair [x, y]");
    try {
      points.emplace_back(p[0].as<double>(), p[1].as<double>());
    } catch (const YAML::Exception&) {
      fail(key, "expected numeric pairs [x, y]");
    }
    if (points.size() > 1 && points.back().first <= points[points.size() - 2].first)
      fail(key, "expected strictly increasing x values");
    if (points.back().second <= 0) fail(key, "expected positive y values");
  }
  return points;
}

std::vector<int> YamlMap::increasing_integers(const std::string& key) const {
  YAML::Node v = value(key);
  if (!v.IsSequence() || v.size() == 0) fail(key, "expected a non-empty list of integers");
  std::vector<int> out;
  for (const YAML::Node& x : v) {
    int n = 0;
    try {
      n = x.as<int>();
    } catch (const YAML::Exception&) {
      fail(key, "expected integers, got '" + (x.IsScalar() ? x.Scalar() : std::string("a non-scalar")) + "'");
    }
    if (n < 0) fail(key, "expected non-negative integers, got " + std::to_string(n));
    if (!out.empty() && n <= out.back()) fail(key, "expected strictly increasing integers");
    out.push_back(n);
  }
  return out;
}

std::int64_t YamlMap::positive_integer(const std::string& key) const {
  const std::int64_t x = integer(key);
  if (x <= 0) fail(key, "expected a positive integer, got " + std::to_string(x));
  return x;
}

std::int64_t YamlMap::positive_integer(const std::string& key, std::int64_t fallback) const {
  return has(key) ? positive_integer(key) : fallback;
}

double YamlMap::positive_number(const std::string& key) const {
  const double x = number(key);
  if (x <= 0) fail(key, "expected a positive number, got " + std::to_string(x));
  return x;
}

double YamlMap::nonnegative_number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const double x = number(key);
  if (x < 0) fail(key, "expected a non-negative number, got " + std::to_string(x));
  return x;
}

void YamlMap::reject_unknown_keys() const {
  for (const auto& entry : node_) {
    // A key that is a list or a map (YAML's "? key" form) is no key of ours.
    if (!entry.first.IsScalar())
      throw InputError(mark_text(file_, entry.first.Mark()) + ": expected a plain key" +
                       (path_.empty() ? std::string() : " in '" + path_ + "'") + ", got a list or mapping as a key");
    const std::string key = entry.first.Scalar();
    if (read_.count(key) == 0) {
      throw InputError(mark_text(file_, entry.first.Mark()) + ": unknown key '" + key_path(key) + "'");
    }
  }
}

}  // namespace tedsim
