#include "tedsim/runtime/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tedsim/core/error.hpp"

namespace tedsim::runtime {

std::size_t Slice::local_numel() const {
  return static_cast<std::size_t>(a1 - a0) * static_cast<std::size_t>(r1 - r0) * static_cast<std::size_t>(local_cols());
}

int Slice::local_cols() const {
  int n = 0;
  for (const auto& c : cols) n += c.second - c.first;
  return n;
}

std::int64_t Slice::global_index(std::size_t i) const {
  const int lc = local_cols();
  const std::size_t rows = static_cast<std::size_t>(r1 - r0);
  const std::size_t col = i % lc;
  const std::size_t row = (i / lc) % rows;
  const std::size_t a = i / (lc * rows);
  int c = 0;
  std::size_t rest = col;
  for (const auto& range : cols) {
    const std::size_t w = static_cast<std::size_t>(range.second - range.first);
    if (rest < w) {
      c = range.first + static_cast<int>(rest);
      break;
    }
    rest -= w;
  }
  return (static_cast<std::int64_t>(a0 + a) * R + (r0 + static_cast<std::int64_t>(row))) * C + c;
}

std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

float init_value(std::uint64_t seed, int tensor_id, std::int64_t index, float std) {
  const std::uint64_t h = mix64(mix64(seed ^ (static_cast<std::uint64_t>(tensor_id) << 40)) + static_cast<std::uint64_t>(index));
  const double u = (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0,1)
  return static_cast<float>((2.0 * u - 1.0) * std::sqrt(3.0) * std);
}

int ParamStore::add(ParamInfo info) {
  info.numel = info.slice.local_numel();
  infos_.push_back(std::move(info));
  return static_cast<int>(infos_.size()) - 1;
}

void ParamStore::finalize(std::uint64_t seed, int nonexpert_group, int expert_group, MemorySpace& memory, bool by_unit) {
  auto pad = [](std::size_t x, int g) { return (x + g - 1) / g * g; };
  const int group[2] = {nonexpert_group, expert_group};
  std::size_t n[2] = {0, 0};
  int unit_count = 1;
  for (const auto& p : infos_) unit_count = std::max(unit_count, p.unit + 1);
  units_.assign(by_unit ? unit_count : 0, UnitRange{});
  for (int u = 0; u < (by_unit ? unit_count : 1); ++u) {
    for (int b = 0; b < 2 && by_unit; ++b) units_[u].offset[b] = n[b];
    for (auto& p : infos_) {
      if (by_unit && p.unit != u) continue;
      p.offset = n[p.expert];
      n[p.expert] += (p.numel + 15) / 16 * 16;  // 64-byte aligned tensors
    }
    for (int b = 0; b < 2 && by_unit; ++b) {
      n[b] = units_[u].offset[b] + pad(n[b] - units_[u].offset[b], group[b] * 16);  // shards stay aligned
      units_[u].size[b] = n[b] - units_[u].offset[b];
    }
  }
  zeros(nonexpert_, pad(std::max<std::size_t>(n[0], 1), nonexpert_group));
  zeros(expert_, pad(std::max<std::size_t>(n[1], 1), expert_group));
  zeros(nonexpert_grad_, nonexpert_.size());
  zeros(expert_grad_, expert_.size());
  // Values are made on the host and copied into the store's memory (a device's, for CUDA).
  std::vector<float> host;
  for (std::size_t id = 0; id < infos_.size(); ++id) {
    const ParamInfo& p = infos_[id];
    host.resize(p.numel);
    for (std::size_t i = 0; i < p.numel; ++i) {
      host[i] = p.mean + (p.std > 0 ? init_value(seed, p.tensor_id, p.slice.global_index(i), p.std) : 0.0f);
    }
    if (p.numel) memory.upload(param(static_cast<int>(id)), host.data(), p.numel * sizeof(float));
  }
}

void ParamStore::zero_grads() {
  nonexpert_grad_.fill_zero();
  expert_grad_.fill_zero();
}

}  // namespace tedsim::runtime
