// Quick pure tests (no MPI_Init, no mpirun): the TED rank layout the communicators are split by,
// the collective table (bytes and bus-bandwidth factors), 16-bit conversions, the table printer.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "tedsim/comm/collective_check.hpp"
#include "tedsim/profile/collective_table.hpp"
#include "tedsim/comm/half.hpp"
#include "tedsim/comm/fault_injection.hpp"
#include "tedsim/comm/watchdog.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/spec/rank_layout.hpp"

namespace tedsim {
namespace {

constexpr GroupKind kKinds[] = {GroupKind::tensor, GroupKind::expert, GroupKind::data,
                                GroupKind::expert_data};

// x stored in `dtype` and read back.
float round_trip(float x, Dtype dtype) {
  std::uint32_t buffer = 0;
  store_from_float(&buffer, 0, dtype, x);
  return load_as_float(&buffer, 0, dtype);
}

// The #wrong check must see a rank missing from a 16-bit sum at any group size (its tolerance is
// 0 while partial sums stay exact integers), and a chunk from the wrong rank or offset in the data
// movement collectives (no periodic pattern lets one pass).
TEST(CollectiveCheckData, MissingRankInA16BitSumIsWrongAtEveryGroupSize) {
  for (Dtype dtype : {Dtype::bf16, Dtype::fp16, Dtype::fp32}) {
    for (int n : {2, 8, 16, 32, 64, 128, 256}) {
      CollectiveCase c;
      c.op = CollectiveOp::all_reduce;
      c.dtype = dtype;
      const double tol = collective_tolerance(c, n);
      int flagged = 0;
      const int elements = 1000;
      for (std::int64_t i = 0; i < elements; ++i) {
        double full = 0, partial_sum = 0;
        for (int r = 0; r < n; ++r) {
          const float x = collective_input_value(c, n, r, i);
          EXPECT_EQ(x, std::round(x));
          full += x;
          if (r != n - 1) partial_sum += x;
        }
        // The sum itself must be exact in the dtype where the tolerance is 0.
        if (tol == 0) {
          EXPECT_EQ(round_trip(float(full), dtype), float(full));
        }
        flagged += std::fabs(partial_sum - full) > tol;
      }
      EXPECT_GT(flagged, elements / 2) << to_string(dtype) << " n=" << n << " tolerance " << tol;
    }
  }
}

TEST(CollectiveCheckData, WrongSourceChunksDifferInDataMovement) {
  for (CollectiveOp op : {CollectiveOp::all_gather, CollectiveOp::all_to_all}) {
    CollectiveCase c;
    c.op = op;
    c.dtype = Dtype::bf16;
    EXPECT_EQ(collective_tolerance(c, 64), 0.0);
    const int n = 40;
    const std::int64_t chunk = 13 * 105;  // a multiple of 13: the old pattern repeated every 13 positions
    for (int r = 0; r + 13 < n; ++r) {
      int same_rank = 0, same_offset = 0;
      for (std::int64_t j = 0; j < chunk; ++j) {
        const float x = collective_input_value(c, n, r, j);
        EXPECT_EQ(round_trip(x, Dtype::bf16), x);  // exact in bf16
        same_rank += x == collective_input_value(c, n, r + 13, j);
        same_offset += x == collective_input_value(c, n, r, chunk + j);
      }
      EXPECT_LT(same_rank, chunk / 50) << to_string(op) << " rank " << r << " vs " << r + 13;
      EXPECT_LT(same_offset, chunk / 50) << to_string(op) << " chunk 0 vs 1 of rank " << r;
    }
  }
}

TEST(TedLayout, DeepSpeedOrderPutsTensorInnermost) {
  const TedLayout l(16, 2, 4, RankLayout::ted);
  EXPECT_EQ(l.data(), 8);
  EXPECT_EQ(l.expert_data(), 2);
  EXPECT_EQ(l.group_members(GroupKind::tensor, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group_members(GroupKind::expert, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(l.group_members(GroupKind::data, 5), (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
}

TEST(TedLayout, DataBeforeExpertSwapsDigits) {
  const TedLayout l(16, 2, 4, RankLayout::data_before_expert);
  // rank = t_idx + 2*(d_idx + 2*e_idx): the expert group strides by t*d_e = 4.
  EXPECT_EQ(l.group_members(GroupKind::expert, 5), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group_members(GroupKind::tensor, 5), (std::vector<int>{4, 5}));
}

TEST(TedLayout, WithoutExpertTensorParallelismExpertDataSpansTensorRanks) {
  const TedLayout l(8, 2, 2, RankLayout::ted, /*expert_tp=*/false);
  EXPECT_EQ(l.group_size(GroupKind::expert_data), 4);
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 2), (std::vector<int>{2, 3, 6, 7}));
}

TEST(TedLayout, GroupsOfEachKindPartitionTheRanks) {
  for (int world : {1, 2, 4, 8, 12})
    for (int t = 1; t <= world; ++t)
      for (int e = 1; t * e <= world; ++e) {
        if (world % (t * e)) continue;
        for (RankLayout order : {RankLayout::ted, RankLayout::data_before_expert})
          for (bool tp : {true, false}) {
            const TedLayout l(world, t, e, order, tp);
            for (GroupKind kind : kKinds) {
              std::set<int> seen;
              for (int r = 0; r < world; ++r) {
                const auto m = l.group_members(kind, r);
                ASSERT_EQ(int(m.size()), l.group_size(kind));
                EXPECT_TRUE(std::find(m.begin(), m.end(), r) != m.end());
                if (m.front() == r) seen.insert(m.begin(), m.end());
              }
              EXPECT_EQ(int(seen.size()), world) << to_string(kind);
              EXPECT_EQ(l.group_count(kind) * l.group_size(kind), world);
            }
            for (int r = 0; r < world; ++r) EXPECT_EQ(l.rank_of(l.coords_of(r)), r);
          }
      }
}

TEST(TedLayout, RejectsDegreesThatDoNotDivide) {
  EXPECT_THROW(TedLayout(6, 4, 1, RankLayout::ted), InputError);
  EXPECT_THROW(TedLayout(8, 0, 1, RankLayout::ted), InputError);
}

TEST(CollectiveTable, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_reduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::send_recv, 4), 1.0);  // the whole message, one link
  static_assert(bus_bandwidth_factor(CollectiveOp::all_reduce, 2) == 1.0, "usable at compile time");
}

TEST(CollectiveTable, CountsSplitEvenly) {
  EXPECT_EQ(usable_count(CollectiveOp::all_gather, 1001, 4), 1000);
  EXPECT_EQ(chunk_count(CollectiveOp::all_gather, 1000, 4), 250);
  EXPECT_EQ(usable_count(CollectiveOp::all_reduce, 1001, 4), 1001);
  EXPECT_EQ(chunk_count(CollectiveOp::all_reduce, 1001, 4), 1001);
  EXPECT_EQ(usable_count(CollectiveOp::send_recv, 1001, 4), 1001);  // a message, not split over ranks
  EXPECT_EQ(chunk_count(CollectiveOp::send_recv, 1001, 4), 1001);
}

TEST(CollectiveTable, SweepCountsStepByFactorAndEndAtMax) {
  EXPECT_EQ(sweep_counts(8, 64, 2.0, Dtype::fp32), (std::vector<std::int64_t>{2, 4, 8, 16}));
  EXPECT_EQ(sweep_counts(8, 100, 2.0, Dtype::fp16), (std::vector<std::int64_t>{4, 8, 16, 32, 50}));
  EXPECT_EQ(sweep_counts(0, 0, 2.0, Dtype::fp32), (std::vector<std::int64_t>{0}));
  EXPECT_THROW(sweep_counts(8, 64, 1.0, Dtype::fp32), InputError);
}

TEST(Half, RoundTripsAndRoundsToNearestEven) {
  for (float x : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f, 1000.5f})
    EXPECT_EQ(half_to_float(float_to_half(x)), x) << x;
  EXPECT_EQ(float_to_half(1.f + std::ldexp(1.f, -11)), float_to_half(1.f));  // tie, to even
  EXPECT_EQ(half_to_float(float_to_half(1.f + 3 * std::ldexp(1.f, -11))), 1.f + std::ldexp(1.f, -9));
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(65520.f))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.f, -25))), 0.f);  // tie below the smallest
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.5f, -25))), std::ldexp(1.f, -24));
  // Exhaustive: every finite half survives half -> float -> half.
  for (unsigned h = 0; h < 0x10000u; ++h)
    if ((h & 0x7c00u) != 0x7c00u) {
      EXPECT_EQ(float_to_half(half_to_float(std::uint16_t(h))), h);
    }
}

TEST(Bf16, RoundTripsAndRoundsToNearestEven) {
  for (float x : {0.f, 1.f, -3.f, 256.f, 1.5f}) EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x);
  EXPECT_EQ(bf16_to_float(float_to_bf16(257.f)), 256.f);  // tie, to even
  EXPECT_EQ(bf16_to_float(float_to_bf16(259.f)), 260.f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(NcclTable, PrintsNcclTestsColumns) {
  CollectiveResult r;
  r.op = CollectiveOp::all_reduce;
  r.group = "tensor";
  r.ranks = 4;
  r.count = 256;
  r.bytes = 1024;
  r.time_median_s = 10e-6;
  r.algbw_gbs = 0.1024;
  r.busbw_gbs = 0.1536;
  const std::string table = format_nccl_table({r, r});
  for (const char* col : {"size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                          "all_reduce on tensor (4 ranks)", "1024", "256", "fp32", "sum", "10.00",
                          "0.10", "0.15"})
    EXPECT_NE(table.find(col), std::string::npos) << col << "\n" << table;
  // One header block for two rows of the same op and group.
  EXPECT_EQ(table.find("# all_reduce"), table.rfind("# all_reduce"));
}

// --inject-fault: the forms the watchdog tests use, and every malformed one an InputError.
TEST(FaultInjection, ParsesKindRankAndStep) {
  const FaultInjection hang = parse_fault_injection("hang:3");
  EXPECT_EQ(hang.kind, FaultInjection::Kind::hang);
  EXPECT_EQ(hang.rank, 3);
  EXPECT_EQ(hang.step, 1);  // the first step unless given
  const FaultInjection exit = parse_fault_injection("exit:0:12");
  EXPECT_EQ(exit.kind, FaultInjection::Kind::exit);
  EXPECT_EQ(exit.rank, 0);
  EXPECT_EQ(exit.step, 12);
  EXPECT_EQ(to_string(exit), "exit:0:12");
  EXPECT_EQ(to_string(FaultInjection{}), "none");
  for (const char* bad : {"", "hang", "hang:", "hang:-1", "hang:1:0", "hang:1:", "hang:x", "stall:1", "exit:1:2:3",
                          "exit:99999999999"})
    EXPECT_THROW(parse_fault_injection(bad), InputError) << bad;
}

TEST(Watchdog, MembersTextListsSmallGroupsAndCountsLargeOnes) {
  EXPECT_EQ(watchdog::members_text({0, 2, 4}), "0,2,4");
  std::vector<int> big(64);
  for (int i = 0; i < 64; ++i) big[std::size_t(i)] = 8 * i;
  const std::string text = watchdog::members_text(big);
  EXPECT_EQ(text.rfind("0,8,16,", 0), 0u);
  EXPECT_NE(text.find("... (64 ranks)"), std::string::npos);
}

}  // namespace
}  // namespace tedsim
