#pragma once
// Strict YAML reading: every key is either read or rejected, every value is checked for type and
// range, and every error names file:line:column and the full key path (e.g. "moe.top_k").
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tedsim {

class YamlMap {
 public:
  // Parses a file; a missing file or malformed YAML is an InputError naming the file (and line).
  static YamlMap load_file(const std::string& path);
  static YamlMap from_string(const std::string& text, const std::string& name);
  YamlMap(YAML::Node node, std::string file, std::string path);

  bool has(const std::string& key) const;
  YamlMap child(const std::string& key) const;  // required nested map
  std::int64_t integer(const std::string& key) const;
  std::int64_t integer(const std::string& key, std::int64_t fallback) const;
  double number(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string text(const std::string& key) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  // A list of [x, y] pairs with strictly increasing x, e.g. an efficiency curve.
  std::vector<std::pair<double, double>> curve(const std::string& key) const;
  // A list of non-negative integers, strictly increasing (e.g. layer indices).
  std::vector<int> increasing_integers(const std::string& key) const;

  // Range checks, each naming the key: value > 0, value >= 0, lo <= value <= hi.
  std::int64_t positive_integer(const std::string& key) const;
  std::int64_t positive_integer(const std::string& key, std::int64_t fallback) const;
  double positive_number(const std::string& key) const;
  double nonnegative_number(const std::string& key, double fallback) const;

  // Every key not read so far is an error: call once a map has been read completely.
  void reject_unknown_keys() const;

  // "file:line:col: key 'path.key'" for messages about a key of this map.
  std::string where(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& file() const { return file_; }

 private:
  YAML::Node value(const std::string& key) const;  // required scalar or node, marks key as read
  std::string key_path(const std::string& key) const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
  mutable std::set<std::string> read_;
};

}  // namespace tedsim
