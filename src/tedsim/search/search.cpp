#include "tedsim/search/search.hpp"

#include <algorithm>
#include <chrono>

namespace tedsim {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

}  // namespace

std::vector<ParallelConfig> enumerate_configs(const ModelSpec& m, const SearchSpace& space) {
  std::vector<ParallelConfig> configs;
  const int G = space.gpus;
  const std::vector<int> expert_degrees = m.is_moe() ? divisors(m.moe.experts) : std::vector<int>{1};
  for (int p : divisors(G)) {
    if ((space.max_pp > 0 && p > space.max_pp) || p > m.layers) continue;
    const int S = G / p;  // devices of one stage
    for (int t : divisors(S)) {
      for (int e : expert_degrees) {
        if (S % (t * e) != 0) continue;
        const int d = S / t;
        if (space.global_batch % d != 0) continue;
        for (bool expert_tp : {true, false}) {
          if (!expert_tp && (t == 1 || !m.is_moe())) continue;  // only differs with experts and t > 1
          const int de = expert_tp ? S / (t * e) : S / e;
          for (RankLayout layout : {RankLayout::ted, RankLayout::data_before_expert}) {
            // The layouts differ only when both expert and expert-data groups have several ranks.
            if (layout == RankLayout::data_before_expert && (e == 1 || de == 1)) continue;
            for (int b : divisors(space.global_batch / d)) {
              const int ga = space.global_batch / (d * b);
              for (int v = 1; v <= (p > 1 ? space.max_vpp : 1); ++v) {
                if (p * v > m.layers || (v > 1 && ga % p != 0)) continue;
                for (bool sp : {false, true}) {
                  if (sp && (t == 1 || !space.sequence_parallel)) continue;
                  for (bool dtd : {false, true}) {
                    // DTD splits tokens over the tensor group; SP already does.
                    if (dtd && (t == 1 || !m.is_moe() || sp)) continue;
                    for (Recompute recompute : space.recompute) {
                      for (bool cac : {false, true}) {
                        // CAC needs full recompute and collectives to stash.
                        if (cac && (recompute != Recompute::full || (t == 1 && e == 1))) continue;
                        for (int zero : space.zero_stages) {
                          for (bool tiled : {true, false}) {
                            if (!tiled && !m.is_moe()) continue;
                            ParallelConfig c;
                            c.gpus = G;
                            c.pp = p;
                            c.vpp = v;
                            c.tp = t;
                            c.ep = e;
                            c.micro_batch = b;
                            c.global_batch = space.global_batch;
                            c.seq_len = space.seq_len;
                            c.sequence_parallel = sp;
                            c.dtd = dtd;
                            c.cac = cac;
                            c.recompute = recompute;
                            c.zero = zero;
                            c.expert_tp = expert_tp;
                            c.tiled_optimizer = tiled;
                            c.layout = layout;
                            if (config_is_valid(c, m)) configs.push_back(c);
                          }
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return configs;
}

SearchResult run_search(const Evaluator& evaluator, const SearchSpace& space, int top_k,
                        const std::function<void(long long, long long)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ParallelConfig> configs = enumerate_configs(evaluator.model(), space);
  SearchResult result;
  struct Ranked {
    double tokens_per_s;
    std::size_t index;
  };
  std::vector<Ranked> feasible;
  const long long total = static_cast<long long>(configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Prediction p = evaluator.evaluate_if_fits(configs[i]);
    ++result.evaluated;
    if (p.fits()) feasible.push_back({p.tokens_per_s, i});
    if (progress && (i + 1) % 65536 == 0) progress(static_cast<long long>(i + 1), total);
  }
  result.feasible = static_cast<long long>(feasible.size());
  const std::size_t keep = std::min<std::size_t>(feasible.size(), std::size_t(std::max(top_k, 0)));
  std::partial_sort(feasible.begin(), feasible.begin() + keep, feasible.end(), [](const Ranked& a, const Ranked& b) {
    return a.tokens_per_s != b.tokens_per_s ? a.tokens_per_s > b.tokens_per_s : a.index < b.index;
  });
  for (std::size_t i = 0; i < keep; ++i) result.top.push_back(evaluator.evaluate(configs[feasible[i].index]));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tedsim
