// TED process groups made from the world communicator: right members and sizes for every layout
// the world size allows (both rank orders, expert tensor parallelism on and off), and correct
// collectives on every group kind with all groups of a kind running at once.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

using test::world;

std::string describe(int t, int e, RankLayout order, bool expert_tp) {
  return "t=" + std::to_string(t) + " e=" + std::to_string(e) + " " + to_string(order) +
         (expert_tp ? " expert_tp" : " no expert_tp");
}

// The members each group communicator really has, gathered over the communicator itself, so the
// check does not just compare the layout with itself.
std::vector<int> actual_members(Communicator& group) {
  const float me = float(world().rank());
  std::vector<float> got(std::size_t(group.size()));
  group.all_gather(&me, got.data(), 1, Dtype::fp32);
  return std::vector<int>(got.begin(), got.end());
}

TEST(TedGroups, EveryLayoutHasRightMembersAndCorrectCollectives) {
  Communicator& w = world();
  const int n = w.size();
  int layouts = 0;
  for (int t = 1; t <= n; ++t)
    for (int e = 1; t * e <= n; ++e) {
      if (n % (t * e)) continue;
      for (RankLayout order : {RankLayout::ted, RankLayout::data_before_expert})
        for (bool expert_tp : {true, false}) {
          SCOPED_TRACE(describe(t, e, order, expert_tp));
          const TedLayout layout(n, t, e, order, expert_tp);
          TedGroups groups(w, layout);
          ++layouts;
          for (GroupKind kind : TedGroups::kinds) {
            SCOPED_TRACE(to_string(kind));
            Communicator& g = groups.group(kind);
            EXPECT_EQ(g.name(), to_string(kind));
            EXPECT_EQ(g.size(), layout.group_size(kind));
            EXPECT_EQ(groups.members(kind), layout.group_members(kind, w.rank()));
            EXPECT_EQ(actual_members(g), groups.members(kind));
            for (CollectiveOp op : {CollectiveOp::all_reduce, CollectiveOp::all_gather,
                                    CollectiveOp::reduce_scatter, CollectiveOp::all_to_all}) {
              CollectiveCase c;
              c.op = op;
              c.count = 96 * g.size();
              c.dtype = op == CollectiveOp::all_to_all ? Dtype::bf16 : Dtype::fp32;
              c.warmup = 1;
              c.iters = 2;
              EXPECT_EQ(check_and_time(g, c).wrong, 0) << to_string(op);
            }
          }
        }
    }
  EXPECT_GE(layouts, 4);
}

// Hand-derived groups for 4 ranks, independent of TedLayout's arithmetic:
// rank = t_idx + t*(e_idx + e*d_idx) (ted) or t_idx + t*(d_idx + d_e*e_idx) (data before expert).
struct Expected {
  int t, e;
  RankLayout order;
  bool expert_tp;
  std::map<GroupKind, std::vector<std::vector<int>>> groups;  // all groups of each kind
};

TEST(TedGroups, FourRanksMatchHandDerivedGroups) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  using G = GroupKind;
  const RankLayout ted = RankLayout::ted, dbe = RankLayout::data_before_expert;
  const std::vector<Expected> cases = {
      {2, 2, ted, true,
       {{G::tensor, {{0, 1}, {2, 3}}}, {G::expert, {{0, 2}, {1, 3}}}, {G::data, {{0, 2}, {1, 3}}},
        {G::expert_data, {{0}, {1}, {2}, {3}}}}},
      {2, 2, ted, false,
       {{G::tensor, {{0, 1}, {2, 3}}}, {G::expert, {{0, 2}, {1, 3}}}, {G::data, {{0, 2}, {1, 3}}},
        {G::expert_data, {{0, 1}, {2, 3}}}}},
      {1, 2, ted, true,
       {{G::tensor, {{0}, {1}, {2}, {3}}}, {G::expert, {{0, 1}, {2, 3}}}, {G::data, {{0, 1, 2, 3}}},
        {G::expert_data, {{0, 2}, {1, 3}}}}},
      {1, 2, dbe, true,
       {{G::tensor, {{0}, {1}, {2}, {3}}}, {G::expert, {{0, 2}, {1, 3}}}, {G::data, {{0, 1, 2, 3}}},
        {G::expert_data, {{0, 1}, {2, 3}}}}},
      {2, 1, ted, true,
       {{G::tensor, {{0, 1}, {2, 3}}}, {G::expert, {{0}, {1}, {2}, {3}}}, {G::data, {{0, 2}, {1, 3}}},
        {G::expert_data, {{0, 2}, {1, 3}}}}},
      {2, 1, ted, false,
       {{G::tensor, {{0, 1}, {2, 3}}}, {G::expert, {{0}, {1}, {2}, {3}}}, {G::data, {{0, 2}, {1, 3}}},
        {G::expert_data, {{0, 1, 2, 3}}}}},
      {1, 4, ted, true,
       {{G::tensor, {{0}, {1}, {2}, {3}}}, {G::expert, {{0, 1, 2, 3}}}, {G::data, {{0, 1, 2, 3}}},
        {G::expert_data, {{0}, {1}, {2}, {3}}}}},
      {1, 4, dbe, false,
       {{G::tensor, {{0}, {1}, {2}, {3}}}, {G::expert, {{0, 1, 2, 3}}}, {G::data, {{0, 1, 2, 3}}},
        {G::expert_data, {{0}, {1}, {2}, {3}}}}},
  };
  for (const Expected& ex : cases) {
    SCOPED_TRACE(describe(ex.t, ex.e, ex.order, ex.expert_tp));
    TedGroups groups(w, TedLayout(4, ex.t, ex.e, ex.order, ex.expert_tp));
    for (const auto& [kind, all] : ex.groups) {
      std::vector<int> mine;
      for (const auto& g : all)
        for (int r : g)
          if (r == w.rank()) mine = g;
      EXPECT_EQ(actual_members(groups.group(kind)), mine) << to_string(kind);
      // The sum of world ranks over the group proves the communicator spans exactly them.
      float x = float(w.rank()), sum = 0;
      groups.group(kind).all_reduce(&x, &x, 1, Dtype::fp32);
      for (int r : mine) sum += float(r);
      EXPECT_EQ(x, sum) << to_string(kind);
    }
  }
}

TEST(TedGroups, AllGroupsOfAKindRunAtOnceWithOneAgreedResult) {
  Communicator& w = world();
  const int n = w.size();
  const TedLayout layout(n, n % 2 == 0 ? 2 : 1, 1, RankLayout::ted);
  TedGroups groups(w, layout);
  std::vector<CollectiveResult> table;
  for (GroupKind kind : TedGroups::kinds) {
    CollectiveCase c;
    c.op = CollectiveOp::all_reduce;
    c.count = 4096;
    c.iters = 3;
    const CollectiveResult r = check_and_time_groups(w, groups.group(kind), c);
    EXPECT_EQ(r.wrong, 0) << to_string(kind);
    EXPECT_EQ(r.groups, layout.group_count(kind)) << to_string(kind);
    EXPECT_EQ(r.group, to_string(kind));
    // Every rank reports the same (slowest-group) time.
    std::vector<double> t{r.time_median_s, -r.time_median_s};
    w.host_max(t);
    EXPECT_EQ(t[0], -t[1]) << to_string(kind);
    table.push_back(r);
  }
  if (w.rank() == 0) std::printf("%s", format_nccl_table(table).c_str());
}

TEST(TedGroups, RejectsLayoutForAnotherWorldSize) {
  Communicator& w = world();
  EXPECT_THROW(TedGroups(w, TedLayout(2 * w.size(), 1, 1, RankLayout::ted)), InputError);
}

}  // namespace
}  // namespace tedsim
