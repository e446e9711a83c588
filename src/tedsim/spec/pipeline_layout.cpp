#include "tedsim/spec/pipeline_layout.hpp"

#include <cctype>

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

// Recursive-descent expansion of the repeat syntax: sequence := (item ['*' N])*; item := symbol | '(' sequence ')'.
class LayoutExpander {
 public:
  static constexpr std::size_t kMaxSymbols = 10'000'000;
  static constexpr int kMaxDepth = 32;  // nested '(': a deeper layout is a typo, not a model
  explicit LayoutExpander(const std::string& text) : text_(text) {}

  std::string expand() {
    std::string out = sequence();
    if (pos_ < text_.size()) fail("unexpected ')'");
    return out;
  }

 private:
  std::string sequence() {
    std::string out;
    while (true) {
      skip_separators();
      if (pos_ >= text_.size() || text_[pos_] == ')') return out;
      std::string item;
      const char c = text_[pos_];
      if (c == '(') {
        if (++depth_ > kMaxDepth) fail("parentheses nested deeper than " + std::to_string(kMaxDepth));
        ++pos_;
        item = sequence();
        --depth_;
        if (pos_ >= text_.size() || text_[pos_] != ')') fail("'(' without its ')'");
        ++pos_;
      } else if (c == 'E' || c == 't' || c == 'L' || c == '|' || c == 'm') {
        item = std::string(1, c);
        ++pos_;
      } else {
        fail(std::string("unknown symbol '") + c + "' (expected E, t, L, |, (, ) or *N)");
      }
      skip_separators();
      if (pos_ < text_.size() && text_[pos_] == '*') {
        ++pos_;
        skip_separators();
        const std::size_t start = pos_;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
        if (start == pos_) fail("'*' without a repeat count");
        if (pos_ - start > 6) fail("repeat count must be 1-100000");
        const long count = std::stol(text_.substr(start, pos_ - start));
        if (count <= 0 || count > 100000) fail("repeat count must be 1-100000");
        // Checked before building it: a nested repeat could ask for gigabytes.
        if (out.size() + item.size() * std::size_t(count) > kMaxSymbols) fail("expands to more than 10^7 symbols");
        std::string repeated;
        repeated.reserve(item.size() * std::size_t(count));
        for (long i = 0; i < count; ++i) repeated += item;
        item = std::move(repeated);
      }
      if (out.size() + item.size() > kMaxSymbols) fail("expands to more than 10^7 symbols");
      out += item;
    }
  }
  void skip_separators() {
    while (pos_ < text_.size() && (text_[pos_] == ',' || std::isspace(static_cast<unsigned char>(text_[pos_])))) ++pos_;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError("--pipeline-layout '" + text_ + "': at position " + std::to_string(pos_) + ": " + what);
  }

  const std::string& text_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<std::string> expand_pipeline_layout(const std::string& layout) {
  const std::string flat = LayoutExpander(layout).expand();
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|') stages.emplace_back();
    else stages.back() += c;
  }
  return stages;
}

std::string pipeline_layout_violation(const std::string& layout, int layers, int pp, int vpp, int mtp_layers) {
  std::vector<std::string> stages;
  try {
    stages = expand_pipeline_layout(layout);
  } catch (const InputError& e) {
    return e.what();
  }
  const std::string where = "--pipeline-layout '" + layout + "': ";
  const std::size_t want = std::size_t(pp) * std::size_t(vpp);
  if (stages.size() != want)
    return where + "has " + std::to_string(stages.size()) + " virtual stages, expected pp x vpp = " + std::to_string(want);
  int transformer = 0, mtp = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    for (std::size_t j = 0; j < stages[i].size(); ++j) {
      const char c = stages[i][j];
      if (c == 't') ++transformer;
      if (c == 'm' && mtp_layers == 0) return where + "'m' (a multi-token-prediction layer): this model has none";
      if (c == 'm') {
        ++mtp;
        const std::string& last = stages.back();
        const bool before_loss = i + 1 == stages.size() && last.find_first_not_of('m', j) == last.size() - 1;
        if (!before_loss) return where + "the multi-token-prediction layers (m) must come last, just before the loss L";
      }
      if (c == 'E' && (i != 0 || j != 0)) return where + "the embedding E must open the first virtual stage";
      if (c == 'L' && (i + 1 != stages.size() || j + 1 != stages[i].size()))
        return where + "the loss L must close the last virtual stage";
    }
  }
  if (stages.front().empty() || stages.front()[0] != 'E') return where + "the first virtual stage must start with E";
  if (stages.back().empty() || stages.back().back() != 'L') return where + "the last virtual stage must end with L";
  if (transformer != layers)
    return where + "holds " + std::to_string(transformer) + " transformer layers (t), the model has " + std::to_string(layers);
  if (mtp != mtp_layers)
    return where + "holds " + std::to_string(mtp) + " multi-token-prediction layers (m), the model has " +
           std::to_string(mtp_layers) + " (place them before L)";
  return {};
}

StageMap build_stage_map(int layers, int pp, int vpp, const std::string& layout, int mtp_layers) {
  StageMap map;
  map.pp = pp;
  map.vpp = vpp;
  const int virtual_stages = pp * vpp;
  map.chunks.resize(std::size_t(virtual_stages));
  if (!layout.empty()) {
    const std::string why = pipeline_layout_violation(layout, layers, pp, vpp, mtp_layers);
    if (!why.empty()) throw InputError(why);
    const std::vector<std::string> stages = expand_pipeline_layout(layout);
    int next = 0;
    for (int i = 0; i < virtual_stages; ++i) {
      ModelChunk& c = map.chunks[std::size_t(i)];
      c.first_layer = next;
      for (char s : stages[std::size_t(i)]) {
        if (s == 't') ++c.layers;
        if (s == 'E') c.embedding = true;
        if (s == 'L') c.head = true;
        if (s == 'm') ++c.mtp_layers;
      }
      next += c.layers;
    }
    return map;
  }
  if (layers < virtual_stages)
    throw InputError("pp x vpp = " + std::to_string(virtual_stages) + " exceeds the model's " + std::to_string(layers) + " layers");
  const int base = layers / virtual_stages;
  int extra = layers % virtual_stages;
  map.uneven = extra != 0;
  std::vector<int> counts(std::size_t(virtual_stages), base);
  // The remainder goes to the middle virtual stages first, then to the first and the last.
  for (int i = 1; i + 1 < virtual_stages && extra > 0; ++i, --extra) ++counts[std::size_t(i)];
  if (extra > 0) ++counts.front(), --extra;
  if (extra > 0) ++counts.back(), --extra;
  int next = 0;
  for (int i = 0; i < virtual_stages; ++i) {
    map.chunks[std::size_t(i)].first_layer = next;
    map.chunks[std::size_t(i)].layers = counts[std::size_t(i)];
    next += counts[std::size_t(i)];
  }
  map.chunks.front().embedding = true;
  map.chunks.back().head = true;
  map.chunks.back().mtp_layers = mtp_layers;
  return map;
}

int StageMap::stage_layers(int stage) const {
  int n = 0;
  for (int v = 0; v < vpp; ++v) n += chunk(stage, v).layers;
  return n;
}

std::string StageMap::describe() const {
  std::string text;
  for (int p = 0; p < pp; ++p) {
    if (p) text += " | ";
    text += "stage " + std::to_string(p) + ":";
    for (int v = 0; v < vpp; ++v) {
      const ModelChunk& c = chunk(p, v);
      text += v ? ", " : " ";
      if (c.embedding) text += "E+";
      text += c.layers == 0 ? std::string("no layers")
              : c.layers == 1 ? "layer " + std::to_string(c.first_layer)
                              : "layers " + std::to_string(c.first_layer) + "-" + std::to_string(c.first_layer + c.layers - 1);
      if (c.mtp_layers > 0) text += "+" + std::to_string(c.mtp_layers) + "m";
      if (c.head) text += "+L";
    }
  }
  return text;
}

}  // namespace tedsim
