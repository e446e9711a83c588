// Collectives on the MPI backend over the whole world: every op, dtype, several sizes, in and out
// of place, checked by the same helper calibration uses (#wrong must be 0 on every rank).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/comm/half.hpp"
#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

using test::world;

std::string host() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

TEST(MpiWorld, RankSizeAndBackend) {
  Communicator& w = world();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(w.rank(), rank);
  EXPECT_EQ(w.size(), size);
  EXPECT_EQ(w.backend(), Backend::cpu);
  EXPECT_STREQ(w.backend_name(), "mpi");
  EXPECT_EQ(w.name(), "world");
}

class MpiCollective : public ::testing::TestWithParam<CollectiveOp> {};

TEST_P(MpiCollective, NoWrongElementsForEveryDtypeAndSize) {
  Communicator& w = world();
  const CollectiveOp op = GetParam();
  std::vector<CollectiveResult> table;
  for (Dtype dtype : {Dtype::fp32, Dtype::fp16, Dtype::bf16})
    for (std::int64_t count : {std::int64_t(0), std::int64_t(1), std::int64_t(w.size()),
                               std::int64_t(1000), std::int64_t(65536 + 5)})
      for (bool in_place : {false, true}) {
        if (in_place && (op == CollectiveOp::all_to_all || op == CollectiveOp::all_to_all_v ||
                         op == CollectiveOp::send_recv))
          continue;
        CollectiveCase c;
        c.op = op;
        c.count = count;
        c.dtype = dtype;
        c.in_place = in_place;
        c.warmup = 1;
        c.iters = 3;
        const CollectiveResult r = check_and_time(w, c);
        SCOPED_TRACE(std::string(to_string(op)) + " " + to_string(dtype) + " count " +
                     std::to_string(count) + (in_place ? " in place" : ""));
        EXPECT_EQ(r.wrong, 0);
        EXPECT_EQ(r.ranks, w.size());
        EXPECT_EQ(r.bytes, r.count * bytes_of(dtype));
        if (splits_over_ranks(op)) {
          EXPECT_EQ(r.count % w.size(), 0);
        } else {
          EXPECT_EQ(r.count, count);
        }
        EXPECT_LE(r.count, count);
        EXPECT_LE(r.time_min_s, r.time_median_s);
        EXPECT_LE(r.time_median_s, r.time_max_s);
        EXPECT_NEAR(r.busbw_gbs, r.algbw_gbs * bus_bandwidth_factor(op, w.size()),
                    1e-9 * (1 + r.algbw_gbs));
        if (!in_place && dtype == Dtype::fp32) table.push_back(r);
      }
  if (w.rank() == 0) std::printf("%s", format_nccl_table(table).c_str());
}

INSTANTIATE_TEST_SUITE_P(AllOps, MpiCollective,
                         ::testing::Values(CollectiveOp::all_reduce, CollectiveOp::all_gather,
                                           CollectiveOp::reduce_scatter, CollectiveOp::all_to_all,
                                           CollectiveOp::send_recv, CollectiveOp::all_to_all_v),
                         [](const ::testing::TestParamInfo<CollectiveOp>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(MpiCollectives, MaxReductions) {
  Communicator& w = world();
  for (CollectiveOp op : {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter})
    for (Dtype dtype : {Dtype::fp32, Dtype::bf16}) {
      CollectiveCase c;
      c.op = op;
      c.dtype = dtype;
      c.redop = ReduceOp::max;
      c.count = 4096;
      c.iters = 2;
      EXPECT_EQ(check_and_time(w, c).wrong, 0) << to_string(op) << " " << to_string(dtype);
    }
}

TEST(MpiCollectives, DirectCallsOnHostVectors) {
  Communicator& w = world();
  const int n = w.size(), me = w.rank();
  // In-place all-reduce of rank+1: n(n+1)/2 everywhere.
  std::vector<float> v(5, float(me + 1));
  w.all_reduce(v.data(), v.data(), v.size(), Dtype::fp32);
  for (float x : v) EXPECT_EQ(x, float(n * (n + 1) / 2));
  // All-gather of the rank: 0..n-1 in rank order.
  const float mine = float(me);
  std::vector<float> all(std::size_t(n), -1.f);
  w.all_gather(&mine, all.data(), 1, Dtype::fp32);
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[std::size_t(r)], float(r));
  // fp16 sums are rounded to fp16 at every step: 1 + 2^-11 is not an fp16 number, 0.5 is.
  std::vector<std::uint16_t> h(3, float_to_half(0.5f));
  w.all_reduce(h.data(), h.data(), h.size(), Dtype::fp16);
  for (auto x : h) EXPECT_EQ(half_to_float(x), 0.5f * float(n));
  w.barrier();
  w.wait();
}

TEST(MpiCollectives, InPlaceAllToAllIsRejected) {
  CollectiveCase c;
  c.op = CollectiveOp::all_to_all;
  c.in_place = true;
  c.count = 16;
  EXPECT_THROW(check_and_time(world(), c), InputError);
}

// Forwards to a real communicator, then flips the first output element on rank 0: the checker
// must notice (and every rank must see the group's total), or #wrong = 0 would prove nothing.
class CorruptingCommunicator final : public Communicator {
 public:
  explicit CorruptingCommunicator(Communicator& inner) : Communicator("corrupt"), in_(inner) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  Backend backend() const override { return in_.backend(); }
  const char* backend_name() const override { return in_.backend_name(); }
  void all_reduce(const void* s, void* r, std::size_t n, Dtype t, ReduceOp op) override {
    in_.all_reduce(s, r, n, t, op);
    corrupt(r, n, t);
  }
  void all_gather(const void* s, void* r, std::size_t n, Dtype t) override {
    in_.all_gather(s, r, n, t);
    corrupt(r, n, t);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, Dtype t, ReduceOp op) override {
    in_.reduce_scatter(s, r, n, t, op);
    corrupt(r, n, t);
  }
  void all_to_all(const void* s, void* r, std::size_t n, Dtype t) override {
    in_.all_to_all(s, r, n, t);
    corrupt(r, n, t);
  }
  void all_to_all_v(const void* s, const std::vector<std::size_t>& sc, void* r, const std::vector<std::size_t>& rc,
                    Dtype t) override {
    in_.all_to_all_v(s, sc, r, rc, t);
    std::size_t received = 0;
    for (std::size_t x : rc) received += x;
    corrupt(r, received, t);
  }
  void barrier() override { in_.barrier(); }
  void wait() override { in_.wait(); }
  void prepare_point_to_point() override { in_.prepare_point_to_point(); }
  std::uint64_t send(const void* b, std::size_t n, Dtype t, int peer) override { return in_.send(b, n, t, peer); }
  bool send_done(std::uint64_t ticket) override { return in_.send_done(ticket); }
  void recv(void* b, std::size_t n, Dtype t, int peer) override {
    in_.recv(b, n, t, peer);
    if (rank() == 1 && n > 0) store_from_float(b, 0, t, load_as_float(b, 0, t) + 100.f);  // rank 0 receives nothing
  }
  void wait_sends() override { in_.wait_sends(); }
  std::unique_ptr<Communicator> split(const std::vector<int>& m, const std::string& n) override {
    return in_.split(m, n);
  }
  std::unique_ptr<CommBuffer> make_buffer(std::size_t bytes) override { return in_.make_buffer(bytes); }
  std::unique_ptr<CommTimer> make_timer() override { return in_.make_timer(); }
  void host_max(std::vector<double>& v) override { in_.host_max(v); }
  std::int64_t host_sum(std::int64_t v) override { return in_.host_sum(v); }

 private:
  void corrupt(void* r, std::size_t n, Dtype t) {
    if (rank() == 0 && n > 0) store_from_float(r, 0, t, load_as_float(r, 0, t) + 100.f);
  }
  Communicator& in_;
};

TEST(MpiCheck, CountsWrongElementsOverTheGroup) {
  CorruptingCommunicator bad(world());
  for (CollectiveOp op : {CollectiveOp::all_reduce, CollectiveOp::all_gather,
                          CollectiveOp::reduce_scatter, CollectiveOp::all_to_all, CollectiveOp::all_to_all_v}) {
    CollectiveCase c;
    c.op = op;
    c.count = 64 * bad.size();
    c.dtype = Dtype::bf16;
    c.iters = 2;
    EXPECT_EQ(check_and_time(bad, c).wrong, 1) << to_string(op);
  }
  // The pipeline chain: rank 1's message from rank 0 is corrupted (one rank: no message at all).
  CollectiveCase c;
  c.op = CollectiveOp::send_recv;
  c.count = 64;
  c.iters = 2;
  EXPECT_EQ(check_and_time(bad, c).wrong, bad.size() > 1 ? 1 : 0);
}

// Every pipeline group of a layout exchanges at once, and each stage gets its predecessor's
// message: with 2 stages of 2 ranks, two chains of two.
TEST(MpiCheck, SendRecvRunsOnEveryPipelineGroupAtOnce) {
  Communicator& w = world();
  if (w.size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  TedGroups groups(w, TedLayout(w.size(), 1, 1, RankLayout::ted, true, 2));
  EXPECT_EQ(groups.pipeline().size(), 2);
  EXPECT_EQ(groups.members(GroupKind::pipeline),
            (std::vector<int>{w.rank() % (w.size() / 2), w.rank() % (w.size() / 2) + w.size() / 2}));
  CollectiveCase c;
  c.op = CollectiveOp::send_recv;
  c.count = 4099;
  c.iters = 3;
  const CollectiveResult r = check_and_time_groups(w, groups.pipeline(), c);
  EXPECT_EQ(r.wrong, 0);
  EXPECT_EQ(r.groups, w.size() / 2);
  EXPECT_EQ(r.bytes, 4099 * 4);
  EXPECT_GT(r.time_median_s, 0);
}

// Uneven splits, as dropless dispatch makes them: rank i sends (i + 2 j + 1) % 5 elements to rank j
// (some zero), each element naming its source, destination and index; every rank checks all it
// receives. #wrong must be 0 on every rank.
TEST(MpiAllToAllV, UnevenSplitsArriveWhole) {
  Communicator& w = world();
  const int n = w.size(), me = w.rank();
  auto count = [](int from, int to) { return std::size_t((from + 2 * to + 1) % 5); };
  auto value = [](int from, int to, std::size_t i) { return float(from * 1000 + to * 10) + float(i) * 0.5f; };
  std::vector<std::size_t> send_counts(n), recv_counts(n);
  std::vector<float> send;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = count(me, j);
    recv_counts[j] = count(j, me);
    for (std::size_t i = 0; i < send_counts[j]; ++i) send.push_back(value(me, j, i));
  }
  std::size_t total = 0;
  for (std::size_t c : recv_counts) total += c;
  std::vector<float> recv(total + 1, -1.0f);  // one guard element past the end
  w.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, Dtype::fp32);
  std::int64_t wrong = 0;
  std::size_t at = 0;
  for (int j = 0; j < n; ++j)
    for (std::size_t i = 0; i < recv_counts[j]; ++i) wrong += recv[at++] != value(j, me, i);
  wrong += recv[total] != -1.0f;
  EXPECT_EQ(w.host_sum(wrong), 0);
  // Mismatched count vectors are a clear error on every rank, before any message moves.
  EXPECT_THROW(w.all_to_all_v(send.data(), std::vector<std::size_t>(n + 1, 0), recv.data(), recv_counts, Dtype::fp32), InputError);
}

// Dropless routing's exchange as calibration times it: rank 0 receives L times the mean rank's
// rows, the others share the rest; every element arrives where the split puts it.
TEST(MpiAllToAllV, CalibrationSplitsArriveWhole) {
  Communicator& w = world();
  const int n = w.size();
  for (double load : {1.0, 1.3, 0.5 * (1 + n), double(n)}) {
    if (load > n) continue;  // one rank: only the even exchange
    CollectiveCase c;
    c.op = CollectiveOp::all_to_all_v;
    c.count = 1000 * n;
    c.busiest_load = load;
    c.iters = 2;
    const std::vector<std::size_t> v = all_to_all_v_counts(c, n);
    ASSERT_EQ(int(v.size()), n);
    EXPECT_EQ(v[0], 1000u);  // the busiest rank's chunk from each rank: count / n
    if (n > 1) {
      // The mean rank receives (count / n) / L from each rank: the busiest's share of the total is L / n.
      double total = 0;
      for (std::size_t x : v) total += double(x);
      EXPECT_NEAR(double(v[0]) / (total / n), load, 0.01 * load) << "load " << load;
      if (load == double(n)) EXPECT_EQ(v[1], 0u);  // everything goes to the busiest rank
    }
    for (Dtype dtype : {Dtype::fp32, Dtype::bf16}) {
      c.dtype = dtype;
      const CollectiveResult r = check_and_time(w, c);
      EXPECT_EQ(r.wrong, 0) << "load " << load << " " << to_string(dtype);
      EXPECT_EQ(r.bytes, c.count * bytes_of(dtype));  // the busiest rank's buffer
    }
  }
  CollectiveCase bad;
  bad.op = CollectiveOp::all_to_all_v;
  bad.count = 8 * n;
  bad.busiest_load = n + 1.0;
  EXPECT_THROW(check_and_time(w, bad), InputError);
}

TEST(MpiErrors, MessagesNameHostAndRank) {
  Communicator& w = world();
  // Every rank fails the same local check, so no rank is left waiting in a collective.
  try {
    w.all_to_all(nullptr, nullptr, std::size_t(INT_MAX) + 1, Dtype::fp32);
    ADD_FAILURE() << "expected RunError";
  } catch (const RunError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("host " + host()), std::string::npos) << msg;
    EXPECT_NE(msg.find("world rank " + std::to_string(w.rank())), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_to_all"), std::string::npos) << msg;
  }
}

TEST(MpiSplit, EvenAndOddRanks) {
  Communicator& w = world();
  std::vector<int> members;
  for (int r = w.rank() % 2; r < w.size(); r += 2) members.push_back(r);
  auto sub = w.split(members, "parity");
  EXPECT_EQ(sub->size(), int(members.size()));
  EXPECT_EQ(members[std::size_t(sub->rank())], w.rank());
  EXPECT_EQ(sub->name(), "parity");
  float x = float(w.rank());
  sub->all_reduce(&x, &x, 1, Dtype::fp32);
  EXPECT_EQ(x, float(std::accumulate(members.begin(), members.end(), 0)));
}

TEST(MpiSplit, RejectsListsWithoutThisRank) {
  Communicator& w = world();
  EXPECT_THROW(w.split({}, "empty"), InputError);
  if (w.size() > 1) {
    try {
      w.split({(w.rank() + 1) % w.size()}, "other");
      ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("does not contain this rank"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("host " + host()), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace tedsim
