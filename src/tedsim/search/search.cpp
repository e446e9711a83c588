#include "tedsim/search/search.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <chrono>
#include <cmath>
#include <iterator>
#include <mutex>
#include <thread>

namespace tedsim {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int i = 1; i <= n / i; ++i) {
    if (n % i != 0) continue;
    low.push_back(i);
    if (i != n / i) high.push_back(n / i);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
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
      for (int cp : divisors(S / t)) {
      if (cp > space.max_cp) break;
      for (int e : expert_degrees) {
        // The TED layouts put experts inside the tensor x expert x data grid; Megatron-Core's MoE
        // parallel folding (whole experts, with SP at t > 1) needs only e to divide the stage.
        const bool grid = S % (t * e) == 0;
        const bool foldable = m.is_moe() && t > 1 && e > 1 && S % e == 0 && space.sequence_parallel;
        if (!grid && !foldable) continue;
        const int d = S / (t * cp);
        if (space.global_batch % d != 0) continue;
        for (bool expert_tp : {true, false}) {
          if (!expert_tp && (t == 1 || !m.is_moe())) continue;  // only differs with experts and t > 1
          const int de = expert_tp ? S / (t * e) : S / e;
          for (RankLayout layout : {RankLayout::ted, RankLayout::data_before_expert, RankLayout::folded}) {
            if (layout != RankLayout::folded && !grid) continue;
            if (layout == RankLayout::folded && (!foldable || expert_tp)) continue;
            // The layouts differ only when both expert and expert-data groups have several ranks.
            if (layout == RankLayout::data_before_expert && (e == 1 || de == 1)) continue;
            for (int b : divisors(space.global_batch / d)) {
              const int ga = space.global_batch / (d * b);
              {
                for (bool sp : {false, true}) {
                  if (sp && (t == 1 || !space.sequence_parallel)) continue;
                  for (bool dtd : {false, true}) {
                    // DTD splits tokens over the tensor group; SP already does.
                    if (dtd && (t == 1 || !m.is_moe() || sp)) continue;
                    for (Recompute recompute : space.recompute) {
                      for (bool cac : {false, true}) {
                        // CAC needs full recompute and collectives to stash.
                        if (cac && (recompute != Recompute::full || (t == 1 && e == 1))) continue;
                        // Chunks, ZeRO stage and optimizer tiling innermost: they leave the
                        // per-layer workload as it is, which the search reuses.
                        for (int v = 1; v <= (p > 1 ? space.max_vpp : 1); ++v) {
                          // Interleaving as Megatron-Core runs it without a custom layout: the
                          // layers divide into P x V chunks, the micro-batches into groups of P.
                          if (p * v > m.layers || (v > 1 && (m.layers % (p * v) != 0 || ga % p != 0))) continue;
                        for (int zero : space.zero_stages) {
                          for (bool tiled : {true, false}) {
                            if (!tiled && !m.is_moe()) continue;
                          for (bool overlap : space.a2a_overlap) {
                            if (overlap && e == 1) continue;
                            ParallelConfig c;
                            c.gpus = G;
                            c.pp = p;
                            c.vpp = v;
                            c.tp = t;
                            c.cp = cp;
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
                            // Megatron-Core runs the shared experts after the router under the
                            // all-to-all overlap, never on their own side stream.
                            c.shared_expert_overlap = space.shared_expert_overlap && m.moe.shared_experts > 0 && !overlap;
                            c.moe_a2a_overlap = overlap;
                            c.moe_a2a_overlap_sms = space.a2a_overlap_sms;
                            c.moe_dispatcher = space.moe_dispatcher;
                            c.adam_moments = space.adam_moments;
                            c.cuda_graph_scopes = space.cuda_graph_scopes;
                            c.fused_grouped_mlp = space.fused_grouped_mlp;
                            c.fp8_attention = space.fp8_attention;
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
      }
    }
  }
  return configs;
}

std::string explain_no_valid_configuration(const ModelSpec& m, const SearchSpace& space) {
  if (!enumerate_configs(m, space).empty()) return {};
  const int G = space.gpus, B = space.global_batch;
  auto s = [](long long x) { return std::to_string(x); };
  // The first broken rule of each candidate (P, t, e), with micro-batch 1.
  std::vector<std::pair<std::string, long long>> removed;
  auto count = [&](const std::string& rule) {
    for (auto& r : removed)
      if (r.first == rule) return void(++r.second);
    removed.push_back({rule, 1});
  };
  long long candidates = 0;
  long long below = 0, above = 0;  // the nearest global batches a structurally valid (P, t, e) takes
  const std::vector<int> expert_degrees = m.is_moe() ? divisors(m.moe.experts) : std::vector<int>{1};
  for (int p : divisors(G)) {
    for (int t : divisors(G / p)) {
      for (int e : expert_degrees) {
        ++candidates;
        const int S = G / p;
        if (p > m.layers) { count("more pipeline stages than layers (" + s(m.layers) + ")"); continue; }
        if (m.heads % t || m.kv_heads % t || m.hidden % t || m.ffn % t || m.vocab % t) {
          count("tp does not divide heads (" + s(m.heads) + "), kv_heads, hidden, ffn or vocab");
          continue;
        }
        if (S % (t * e) != 0) { count("tp x ep does not divide the devices of a stage"); continue; }
        const long long d = S / t;
        if (B % d != 0) {
          count("the global batch is not a multiple of the data degree");
          const long long lo = B / d * d, hi = lo + d;
          if (lo > 0 && lo > below) below = lo;
          if (above == 0 || hi < above) above = hi;
          continue;
        }
        // The options every plan shares (dispatcher, CUDA graphs, fused MLP) break a rule of their
        // own: name it, as a plain (P, t, e) plan at micro-batch 1 meets it.
        ParallelConfig c;
        c.gpus = G, c.pp = p, c.tp = t, c.ep = e, c.micro_batch = 1, c.global_batch = B, c.seq_len = space.seq_len;
        c.recompute = Recompute::none, c.dtd = false, c.cac = false, c.expert_tp = !space.fused_grouped_mlp;
        c.moe_dispatcher = space.moe_dispatcher, c.adam_moments = space.adam_moments;
        c.cuda_graph_scopes = space.cuda_graph_scopes, c.fused_grouped_mlp = space.fused_grouped_mlp;
        c.fp8_attention = space.fp8_attention;
        const std::string why = config_violation(c, m);
        count(why.empty() || why.find("global batch") != std::string::npos ? "another rule (chunks, recompute or ZeRO options)"
                                                                         : why);
      }
    }
  }
  std::string text = "no valid configuration of '" + m.name + "' on " + s(G) + " devices with global batch " + s(B) +
                     ": of " + s(candidates) + " (pp, tp, ep) candidates,";
  for (std::size_t i = 0; i < removed.size(); ++i)
    text += (i ? ";" : "") + std::string(" ") + s(removed[i].second) + " break: " + removed[i].first;
  if (below > 0 || above > 0) {
    text += ". Global batches that work on " + s(G) + " devices:";
    if (below > 0) text += " " + s(below);
    if (above > 0) text += (below > 0 ? " or " : " ") + s(above);
  }
  return text;
}

namespace {

// Everything but the chunk count, the optimizer tiling and ZeRO 0-2 shapes the per-layer workload.
bool same_workload(const ParallelConfig& a, const ParallelConfig& b) {
  return a.gpus == b.gpus && a.pp == b.pp && a.tp == b.tp && a.cp == b.cp && a.ep == b.ep && a.micro_batch == b.micro_batch &&
         a.global_batch == b.global_batch && a.seq_len == b.seq_len && a.dtd == b.dtd && a.cac == b.cac &&
         a.recompute == b.recompute && a.recompute_modules == b.recompute_modules &&
         a.sequence_parallel == b.sequence_parallel && (a.zero >= 3) == (b.zero >= 3) && a.expert_tp == b.expert_tp &&
         a.layout == b.layout && a.pipeline_layout == b.pipeline_layout &&
         a.shared_expert_overlap == b.shared_expert_overlap;
}

struct Ranked {
  double tokens_per_s;
  std::size_t index;
};
bool better(const Ranked& a, const Ranked& b) {
  return a.tokens_per_s != b.tokens_per_s ? a.tokens_per_s > b.tokens_per_s : a.index < b.index;
}

// The best `keep` of `configs`, one thread's share of the search. A
// configuration whose lower bound cannot beat the share's current k-th best skips the timeline;
// that is exact, since the share's k-th best is never better than the whole search's.
struct Share {
  std::vector<Ranked> best;  // sorted, at most `keep`
  // The best with each knob off (what the best plan is compared with); tokens_per_s 0 while none fits.
  std::array<Ranked, kKnobCount> without{};
  long long evaluated = 0, feasible = 0;
  double smallest_peak = 0, capacity = 0;
  std::vector<std::pair<std::size_t, PlanPoint>> points;  // (index in the share, point), with every_point
};

Share search_share(const Evaluator& shared, const std::vector<ParallelConfig>& configs, std::size_t keep,
                   const std::function<void(long long)>& tick, bool every_point) {
  const Evaluator evaluator(shared.model(), shared.topology(), shared.profile());  // own group-span cache
  Share share;
  auto workload_holder = std::make_unique<Workload>();
  Workload& workload = *workload_holder;
  const ParallelConfig* built = nullptr;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const ParallelConfig& c = configs[i];
    if (built == nullptr || !same_workload(*built, c)) {
      evaluator.build_workload_for(c, workload);
      built = &c;
    }
    workload.zero = c.zero;
    workload.tiled_optimizer = c.tiled_optimizer;
    // Ranking by tokens/s is ranking by iteration time: every configuration runs the same batch.
    // A configuration may be skipped only where it can enter neither the top K nor the best
    // without any of the knobs it has off.
    double worst_kept = share.best.size() < keep || keep == 0 ? 0.0 : share.best.back().tokens_per_s;
    bool knobs[kKnobCount];
    for (int k = 0; k < kKnobCount; ++k) {
      knobs[k] = knob_on(c, Knob(k), evaluator.model().is_moe());
      if (!knobs[k]) worst_kept = std::min(worst_kept, share.without[std::size_t(k)].tokens_per_s);
    }
    const Prediction p = evaluator.evaluate_bounded(c, workload, every_point ? 0.0 : worst_kept);
    ++share.evaluated;
    if (share.smallest_peak == 0 || p.memory.peak < share.smallest_peak) share.smallest_peak = p.memory.peak;
    share.capacity = p.memory.capacity;
    if (p.fits()) {
      ++share.feasible;
      if (every_point) share.points.push_back({i, PlanPoint{c, p.sim.iteration_s, p.tokens_per_s, p.memory.peak}});
      const Ranked r{p.tokens_per_s, i};
      if (keep > 0 && p.tokens_per_s > 0 && (share.best.size() < keep || better(r, share.best.back()))) {
        share.best.insert(std::upper_bound(share.best.begin(), share.best.end(), r, better), r);
        if (share.best.size() > keep) share.best.pop_back();
      }
      for (int k = 0; k < kKnobCount; ++k) {
        Ranked& b = share.without[std::size_t(k)];
        if (!knobs[k] && p.tokens_per_s > 0 && (b.tokens_per_s == 0 || better(r, b))) b = r;
      }
    }
    if (tick && share.evaluated % 8192 == 0) tick(8192);
  }
  return share;
}

}  // namespace

bool predicts_the_same(const Prediction& a, const Prediction& b) {
  return std::fabs(a.sim.iteration_s - b.sim.iteration_s) <= 1e-9 * a.sim.iteration_s &&
         std::fabs(a.memory.peak - b.memory.peak) <= 1e-6 * a.memory.peak;
}

SearchResult run_search(const Evaluator& evaluator, const SearchSpace& space, int top_k,
                        const std::function<void(long long, long long)>& progress, int threads, bool every_point) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ParallelConfig> configs = enumerate_configs(evaluator.model(), space);
  SearchResult result;
  const long long total = static_cast<long long>(configs.size());
  const std::size_t keep = std::size_t(std::max(top_k, 0));
  threads = std::max(1, std::min<int>(threads, int(std::max<std::size_t>(configs.size() / 4096, 1))));
  std::atomic<long long> done{0};
  std::mutex progress_mutex;
  const auto tick = [&](long long n) {
    const long long now = done += n;
    if (progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      progress(now, total);
    }
  };
  // Threads take interleaved blocks of consecutive configurations, so each sees every part of the
  // enumeration and configurations sharing a workload mostly stay together.
  const std::size_t thread_count = static_cast<std::size_t>(threads);
  std::vector<Share> shares(thread_count);
  if (threads == 1) {
    shares[0] = search_share(evaluator, configs, keep, tick, every_point);
  } else {
    std::vector<std::thread> pool;
    std::vector<std::vector<ParallelConfig>> parts(thread_count);
    std::vector<std::vector<std::size_t>> indices(thread_count);
    constexpr std::size_t kBlock = 256;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const std::size_t t = (i / kBlock) % thread_count;
      parts[t].push_back(configs[i]);
      indices[t].push_back(i);
    }
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { shares[std::size_t(t)] = search_share(evaluator, parts[std::size_t(t)], keep, tick, every_point); });
    for (std::thread& th : pool) th.join();
    for (int t = 0; t < threads; ++t) {
      for (Ranked& r : shares[std::size_t(t)].best) r.index = indices[std::size_t(t)][r.index];
      for (Ranked& r : shares[std::size_t(t)].without)
        if (r.tokens_per_s > 0) r.index = indices[std::size_t(t)][r.index];
      for (auto& point : shares[std::size_t(t)].points) point.first = indices[std::size_t(t)][point.first];
    }
  }
  std::vector<Ranked> best;
  for (const Share& s : shares) {
    result.evaluated += s.evaluated;
    result.feasible += s.feasible;
    if (s.evaluated > 0 && (result.smallest_peak == 0 || s.smallest_peak < result.smallest_peak))
      result.smallest_peak = s.smallest_peak;
    if (s.evaluated > 0) result.capacity = s.capacity;
    best.insert(best.end(), s.best.begin(), s.best.end());
  }
  std::sort(best.begin(), best.end(), better);
  if (every_point) {
    std::vector<std::pair<std::size_t, PlanPoint>> all;
    for (Share& s : shares) std::move(s.points.begin(), s.points.end(), std::back_inserter(all));
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& point : all) result.points.push_back(std::move(point.second));
  }
  if (best.size() > keep) best.resize(keep);
  for (const Ranked& r : best) result.top.push_back(evaluator.evaluate(configs[r.index]));
  if (!result.top.empty()) {
    for (int k = 0; k < kKnobCount; ++k) {
      if (!knob_on(result.top.front().config, Knob(k), evaluator.model().is_moe())) continue;
      Ranked off{0, 0};
      for (const Share& s : shares) {
        const Ranked& r = s.without[std::size_t(k)];
        if (r.tokens_per_s > 0 && (off.tokens_per_s == 0 || better(r, off))) off = r;
      }
      if (off.tokens_per_s > 0) result.without[std::size_t(k)] = evaluator.evaluate(configs[off.index]);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tedsim
