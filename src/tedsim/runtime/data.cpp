#include "tedsim/runtime/data.hpp"

#include <fstream>
#include <sstream>

#include "tedsim/core/error.hpp"
#include "tedsim/runtime/params.hpp"

namespace tedsim::runtime {

TokenSource::TokenSource(int vocab, std::uint64_t seed, double noise) : vocab_(vocab), seed_(seed), noise_(noise) {
  if (vocab < 2) throw InputError("token source: vocabulary must have at least 2 tokens");
  // a odd and coprime-ish with V, so the map is a permutation with long cycles for power-of-2 V.
  a_ = static_cast<std::int64_t>(2 * (mix64(seed ^ 0xabcdefULL) % (vocab / 2)) + 1) % vocab;
  if (a_ <= 1) a_ = vocab > 5 ? 5 : 1;
  b_ = static_cast<std::int64_t>(mix64(seed ^ 0x12345ULL) % vocab);
}

TokenSource TokenSource::from_file(const std::string& path, int vocab, int seq) {
  TokenSource src(vocab, 0, 0.0);
  src.file_ = path;
  const bool binary = path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  std::ifstream in(path, binary ? std::ios::binary : std::ios::in);
  if (!in) throw InputError("--data: cannot open token file '" + path + "'");
  if (binary) {
    std::int32_t v;
    while (in.read(reinterpret_cast<char*>(&v), sizeof v)) src.file_tokens_.push_back(v);
  } else {
    long long v;
    while (in >> v) src.file_tokens_.push_back(static_cast<std::int32_t>(v));
    if (!in.eof()) throw InputError("--data: '" + path + "' holds something other than integer token ids");
  }
  for (std::size_t i = 0; i < src.file_tokens_.size(); ++i)
    if (src.file_tokens_[i] < 0 || src.file_tokens_[i] >= vocab)
      throw InputError("--data: '" + path + "' token " + std::to_string(i) + " = " + std::to_string(src.file_tokens_[i]) +
                       " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (static_cast<std::int64_t>(src.file_tokens_.size()) < seq + 2)
    throw InputError("--data: '" + path + "' holds " + std::to_string(src.file_tokens_.size()) +
                     " tokens, fewer than one sequence of " + std::to_string(seq + 1));
  return src;
}

void TokenSource::sample(std::int64_t g, int seq, std::int32_t* inputs, std::int32_t* targets) const {
  if (!file_tokens_.empty()) {
    const std::int64_t n = static_cast<std::int64_t>(file_tokens_.size());
    const std::int64_t start = (g * seq) % (n - seq - 1);
    for (int i = 0; i < seq; ++i) {
      inputs[i] = file_tokens_[start + i];
      targets[i] = file_tokens_[start + i + 1];
    }
    return;
  }
  const std::uint64_t base = mix64(seed_ * 0x100000001b3ULL + static_cast<std::uint64_t>(g));
  std::int64_t tok = static_cast<std::int64_t>(base % vocab_);
  for (int i = 0; i <= seq; ++i) {
    if (i > 0) {
      const std::uint64_t h = mix64(base + static_cast<std::uint64_t>(i));
      const double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
      tok = u < noise_ ? static_cast<std::int64_t>(mix64(h) % vocab_) : (a_ * tok + b_) % vocab_;
    }
    if (i < seq) inputs[i] = static_cast<std::int32_t>(tok);
    if (i > 0) targets[i - 1] = static_cast<std::int32_t>(tok);
  }
}

std::string TokenSource::describe() const {
  if (!file_.empty()) return "file " + file_ + " (" + std::to_string(file_tokens_.size()) + " tokens)";
  std::ostringstream s;
  s << "synthetic: next = (" << a_ << " * t + " << b_ << ") mod " << vocab_ << ", noise " << noise_;
  return s.str();
}

}  // namespace tedsim::runtime
