#pragma once
// Router cases shared by the CPU test of the CUDA routers' per-token code (test_router_token.cpp)
// and the GPU test of the kernels (tests/gpu/test_gpu_router.cpp): every router kind, with and
// without renormalization, group-limited, with a capacity that drops choices (factor < 1) and
// dropless (factor 0); token counts off a warp multiple.
#include "tedsim/kernels/cpu/router.hpp"

namespace tedsim::kernels::test {

struct RouterCase {
  const char* name;
  int tokens, experts;
  RouterConfig cfg;
};

inline RouterConfig router_config(RouterKind kind, int k, bool normalize, float scaling, int groups, int topk_groups,
                                  double factor) {
  RouterConfig c;
  c.kind = kind;
  c.k = k;
  c.normalize = normalize;
  c.scaling = scaling;
  c.groups = groups;
  c.topk_groups = topk_groups;
  c.capacity_factor = factor;
  c.drop_tokens = factor > 0;
  return c;
}

inline const RouterCase kRouterCases[] = {
    {"softmax_topk", 257, 16, router_config(RouterKind::softmax_topk, 4, false, 1.0f, 1, 1, 0.8)},
    {"softmax_topk normalized", 257, 16, router_config(RouterKind::softmax_topk, 4, true, 1.0f, 1, 1, 0.8)},
    {"softmax_topk dropless", 300, 64, router_config(RouterKind::softmax_topk, 8, true, 1.0f, 1, 1, 0)},
    {"topk_softmax", 131, 8, router_config(RouterKind::topk_softmax, 2, false, 1.0f, 1, 1, 0.7)},
    {"topk_softmax dropless", 131, 8, router_config(RouterKind::topk_softmax, 2, false, 1.0f, 1, 1, 0)},
    {"sigmoid scaled", 200, 32, router_config(RouterKind::sigmoid, 4, false, 2.5f, 1, 1, 0.9)},
    {"sigmoid normalized groups", 200, 64, router_config(RouterKind::sigmoid, 8, true, 2.5f, 8, 4, 0)},
    {"softmax_topk groups", 97, 24, router_config(RouterKind::softmax_topk, 4, true, 1.0f, 4, 2, 0.75)},
};

}  // namespace tedsim::kernels::test
