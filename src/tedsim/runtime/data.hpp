#pragma once
// Token data for the training step.
//
// Synthetic (default): sequence g of the run starts at a token drawn from (seed, g), and each next
// token is (a * token + b) mod V, except that with probability `noise` it is a uniformly drawn
// token. The rule is learnable (the loss falls towards the noise floor), deterministic, and
// independent of the parallel configuration: sample g is the same sequence on every rank count.
// File: a token-id file (binary int32 when the name ends in .bin, else whitespace-separated
// integers); sample g is the window starting at (g * seq) mod (n - seq - 1).
#include <cstdint>
#include <string>
#include <vector>

namespace tedsim::runtime {

class TokenSource {
 public:
  TokenSource(int vocab, std::uint64_t seed, double noise = 0.1);
  // Throws InputError for a missing or unreadable file, an id outside [0, vocab), or too few tokens.
  static TokenSource from_file(const std::string& path, int vocab, int seq);

  // Fills inputs[seq] and targets[seq] (the inputs shifted by one) of global sample g.
  void sample(std::int64_t g, int seq, std::int32_t* inputs, std::int32_t* targets) const;
  std::string describe() const;

 private:
  int vocab_;
  std::uint64_t seed_;
  double noise_;
  std::int64_t a_ = 0, b_ = 0;
  std::vector<std::int32_t> file_tokens_;
  std::string file_;
};

}  // namespace tedsim::runtime
