#include "tedsim/comm/collective_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tedsim/comm/half.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {

namespace {

bool reduces(CollectiveOp op) { return op == CollectiveOp::all_reduce || op == CollectiveOp::reduce_scatter; }

// Largest integer below which every integer is exact in the dtype.
double exact_integers(Dtype dtype) { return dtype == Dtype::fp32 ? 16777216.0 : dtype == Dtype::fp16 ? 2048.0 : 256.0; }

// Largest input magnitude v of a reduction over n ranks: every partial sum (at most v*n) stays an
// exact integer, so any correct order of additions gives the exact result and the check can ask
// for equality; a missing or doubled rank then changes an element by up to v.
int reduction_range(Dtype dtype, int n) { return std::clamp(int(exact_integers(dtype) / std::max(n, 1)), 1, 6); }

// Input element i of rank r.
// - Reductions: integers in [-v, v], different per rank and per position, so a missing or doubled
//   rank shows up and sums stay exact (see reduction_range).
// - All-gather, all-to-all and send-recv only move data: a hash of (rank, position) into the exact integers
//   of every dtype, so a chunk from the wrong rank or the wrong offset differs almost everywhere
//   (a pattern periodic in the rank or the position would let such a chunk pass).
float input_value(const CollectiveCase& c, int n, int r, std::int64_t i) {
  if (reduces(c.op)) {
    const int v = reduction_range(c.dtype, n);
    return float(int((std::int64_t(r) * 5 + i * 3) % (2 * v + 1)) - v);
  }
  std::uint64_t h = std::uint64_t(i) * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(r) + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return float(int(h % 251) - 125);
}

// Expected value of element i of rank `me`'s output, and where the output starts in its buffer.
// `v`: all_to_all_v's per-destination counts (all_to_all_v_counts).
float expected_value(const CollectiveCase& c, int n, int me, std::int64_t chunk, std::int64_t i,
                     const std::vector<std::size_t>& v) {
  auto reduce = [&](std::int64_t index) {
    float acc = input_value(c, n, 0, index);
    for (int r = 1; r < n; ++r) {
      const float x = input_value(c, n, r, index);
      acc = c.redop == ReduceOp::sum ? acc + x : std::max(acc, x);
    }
    return acc;
  };
  switch (c.op) {
    case CollectiveOp::all_reduce: return reduce(i);
    case CollectiveOp::all_gather: return input_value(c, n, int(i / chunk), i % chunk);
    case CollectiveOp::reduce_scatter: return reduce(std::int64_t(me) * chunk + i);
    case CollectiveOp::all_to_all:
      return input_value(c, n, int(i / chunk), std::int64_t(me) * chunk + i % chunk);
    case CollectiveOp::send_recv: return input_value(c, n, me - 1, i);  // the previous stage's message
    case CollectiveOp::all_to_all_v: {
      // From rank i / v[me], its segment for `me`, which starts after its segments for ranks < me.
      const std::int64_t mine = std::int64_t(v[std::size_t(me)]);
      std::int64_t offset = 0;
      for (int j = 0; j < me; ++j) offset += std::int64_t(v[std::size_t(j)]);
      return input_value(c, n, int(i / mine), offset + i % mine);
    }
    case CollectiveOp::count: break;
  }
  return 0;
}

// 0 where the check is exact: data movement, max, and sums whose partial sums stay exact
// integers. Otherwise (16-bit sums over groups too large for that) a rounding bound: n-1
// additions, each off by at most half an ulp of a partial sum no larger than v*n.
double tolerance(const CollectiveCase& c, int n) {
  if (!reduces(c.op) || c.redop != ReduceOp::sum) return 0.0;
  const int v = reduction_range(c.dtype, n);
  if (double(v) * n <= exact_integers(c.dtype)) return 0.0;
  const double eps = c.dtype == Dtype::fp16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  return eps * 0.5 * v * double(n) * n;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

const char* redop_name(const CollectiveResult& r) {
  return reduces(r.op) ? to_string(r.redop) : "none";
}

}  // namespace

float collective_input_value(const CollectiveCase& c, int n, int r, std::int64_t i) { return input_value(c, n, r, i); }

std::vector<std::size_t> all_to_all_v_counts(const CollectiveCase& c, int n) {
  const std::size_t busiest = std::size_t(std::max<std::int64_t>(c.count, 0) / std::max(n, 1));
  std::vector<std::size_t> counts(std::size_t(std::max(n, 1)), busiest);
  if (n > 1)
    for (int j = 1; j < n; ++j)
      counts[std::size_t(j)] = std::size_t(double(busiest) * (n - c.busiest_load) / (c.busiest_load * (n - 1)));
  return counts;
}
double collective_tolerance(const CollectiveCase& c, int n) { return tolerance(c, n); }

namespace {

// `starter` begins every timed repetition with a barrier: the group itself, or (all groups of a
// kind at once) the world, so the groups' repetitions overlap as in a step instead of drifting
// apart, which would leave the slowest group's later repetitions with the links to itself.
CollectiveResult check_and_time_started_by(Communicator& comm, const CollectiveCase& c, Communicator& starter) {
  const int n = comm.size(), me = comm.rank();
  if (c.count < 0 || c.warmup < 0 || c.iters < 1)
    throw InputError(comm.where() + ": collective check needs count >= 0, warmup >= 0, iters >= 1");
  if (c.op == CollectiveOp::all_to_all_v && !(c.busiest_load >= 1.0 && c.busiest_load <= n))
    throw InputError(comm.where() + ": all_to_all_v's busiest load must lie in [1, " + std::to_string(n) + "], got " +
                     std::to_string(c.busiest_load));
  if (c.in_place && (c.op == CollectiveOp::all_to_all || c.op == CollectiveOp::all_to_all_v ||
                     c.op == CollectiveOp::send_recv))
    throw InputError(comm.where() + ": " + to_string(c.op) + " cannot run in place");
  if (!reduces(c.op) && c.redop != ReduceOp::sum)
    throw InputError(comm.where() + ": " + to_string(c.op) + " does not reduce; redop must be sum");

  CollectiveResult res;
  res.op = c.op;
  res.dtype = c.dtype;
  res.redop = c.redop;
  res.in_place = c.in_place;
  res.group = comm.name();
  res.ranks = n;
  res.count = usable_count(c.op, c.count, n);
  const std::size_t esize = std::size_t(bytes_of(c.dtype));
  res.bytes = res.count * std::int64_t(esize);
  const std::int64_t chunk = chunk_count(c.op, res.count, n);

  // Element counts of this rank's input and output, and where the output sits in its buffer.
  std::int64_t in_count = res.count, out_count = res.count, out_offset = 0;
  if (c.op == CollectiveOp::all_gather) in_count = chunk;
  if (c.op == CollectiveOp::reduce_scatter) out_count = chunk;
  // all_to_all_v: every rank sends v[j] to rank j and receives its own v[me] from every rank.
  std::vector<std::size_t> v_send, v_recv;
  if (c.op == CollectiveOp::all_to_all_v) {
    v_send = all_to_all_v_counts(c, n);
    v_recv.assign(std::size_t(n), v_send[std::size_t(me)]);
    in_count = 0;
    for (std::size_t x : v_send) in_count += std::int64_t(x);
    out_count = std::int64_t(n) * std::int64_t(v_send[std::size_t(me)]);
  }
  // send_recv is a chain: the first stage receives nothing (its buffer keeps one element, so every
  // rank has one to hand the backend), the last sends nothing.
  const bool receives = c.op != CollectiveOp::send_recv || me > 0;
  const bool sends = c.op != CollectiveOp::send_recv || me + 1 < n;
  if (!receives) out_count = 0;
  if (c.op == CollectiveOp::send_recv) comm.prepare_point_to_point();  // once per communicator

  // Host images of the input (for upload) and of the expected output.
  std::vector<std::byte> host_in(std::size_t(in_count) * esize);
  for (std::int64_t i = 0; i < in_count; ++i)
    store_from_float(host_in.data(), i, c.dtype, input_value(c, n, me, i));

  // Buffers: out of place, a send and a receive buffer; in place, one buffer laid out as NCCL
  // expects (all-gather input at rank*chunk of the output, reduce-scatter output at rank*chunk
  // of the input).
  std::unique_ptr<CommBuffer> send, recv;
  std::size_t in_upload_offset = 0;
  if (c.in_place) {
    const std::int64_t whole = std::max(in_count, out_count);
    recv = comm.make_buffer(std::size_t(whole) * esize);
    if (c.op == CollectiveOp::all_gather) in_upload_offset = std::size_t(me) * std::size_t(chunk) * esize;
    if (c.op == CollectiveOp::reduce_scatter) out_offset = std::int64_t(me) * chunk;
  } else {
    send = comm.make_buffer(std::size_t(in_count) * esize);
    // At least one element each: the first stage of send_recv, and all-to-all-v's ranks that
    // receive nothing at tiny sizes, still hand the backend a buffer.
    recv = comm.make_buffer(std::size_t(std::max<std::int64_t>(out_count, 1)) * esize);
  }
  CommBuffer& in_buf = c.in_place ? *recv : *send;
  char* const recv_ptr = static_cast<char*>(recv->data());
  const void* send_ptr = c.in_place ? recv_ptr + in_upload_offset : in_buf.data();
  void* out_ptr = recv_ptr + (c.op == CollectiveOp::reduce_scatter && c.in_place
                                  ? std::size_t(out_offset) * esize : 0);
  if (c.op == CollectiveOp::all_reduce && c.in_place) out_ptr = recv_ptr;

  auto upload_input = [&] { in_buf.upload(host_in.data(), host_in.size(), in_upload_offset); };
  auto run_once = [&] {
    switch (c.op) {
      case CollectiveOp::all_reduce:
        comm.all_reduce(send_ptr, out_ptr, std::size_t(res.count), c.dtype, c.redop);
        break;
      case CollectiveOp::all_gather:
        comm.all_gather(send_ptr, recv_ptr, std::size_t(chunk), c.dtype);
        break;
      case CollectiveOp::reduce_scatter:
        comm.reduce_scatter(send_ptr, out_ptr, std::size_t(chunk), c.dtype, c.redop);
        break;
      case CollectiveOp::all_to_all:
        comm.all_to_all(send_ptr, recv_ptr, std::size_t(chunk), c.dtype);
        break;
      case CollectiveOp::all_to_all_v:
        comm.all_to_all_v(send_ptr, v_send, recv_ptr, v_recv, c.dtype);
        break;
      case CollectiveOp::send_recv:
        // Send first: the send returns at once, so the chain never waits on itself.
        if (sends) comm.send(send_ptr, std::size_t(res.count), c.dtype, me + 1);
        if (receives) comm.recv(recv_ptr, std::size_t(res.count), c.dtype, me - 1);
        comm.wait_sends();
        break;
      case CollectiveOp::count: break;
    }
  };

  upload_input();
  for (int w = 0; w < c.warmup; ++w) {
    if (c.in_place) upload_input();  // an in-place reduction overwrote its input
    run_once();
  }
  comm.wait();

  auto timer = comm.make_timer();
  std::vector<double> times(std::size_t(c.iters));
  for (int it = 0; it < c.iters; ++it) {
    if (c.in_place) upload_input();
    if (c.before_each) c.before_each();
    // Start together, so a late rank's skew is not charged to the collective.
    starter.barrier();
    timer->start();
    run_once();
    timer->stop();
    times[std::size_t(it)] = timer->seconds();
  }
  comm.host_max(times);
  res.time_median_s = median(times);
  res.time_min_s = *std::min_element(times.begin(), times.end());
  res.time_max_s = *std::max_element(times.begin(), times.end());
  if (res.time_median_s > 0) {
    res.algbw_gbs = double(res.bytes) / res.time_median_s / kGB;
    res.busbw_gbs = res.algbw_gbs * bus_bandwidth_factor(c.op, n);
  }

  // Check the last repetition's output.
  std::vector<std::byte> host_out(std::size_t(out_count) * esize);
  recv->download(host_out.data(), host_out.size(), std::size_t(out_offset) * esize);
  const double tol = tolerance(c, n);
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < out_count; ++i) {
    const double got = load_as_float(host_out.data(), i, c.dtype);
    const double want = expected_value(c, n, me, chunk, i, v_send);
    if (!(std::fabs(got - want) <= tol)) ++wrong;  // NaN counts as wrong
  }
  res.wrong = comm.host_sum(wrong);
  return res;
}

}  // namespace

CollectiveResult check_and_time(Communicator& comm, const CollectiveCase& c) {
  return check_and_time_started_by(comm, c, comm);
}

CollectiveResult check_and_time_groups(Communicator& world, Communicator& group,
                                       const CollectiveCase& c) {
  CollectiveResult r = check_and_time_started_by(group, c, world);
  // Group results are already agreed inside each group; count each group once, via its rank 0.
  const bool leader = group.rank() == 0;
  r.groups = int(world.host_sum(leader ? 1 : 0));
  r.wrong = world.host_sum(leader ? r.wrong : 0);
  std::vector<double> t{r.time_median_s, r.time_min_s, r.time_max_s};
  world.host_max(t);
  r.time_median_s = t[0];
  r.time_min_s = t[1];
  r.time_max_s = t[2];
  r.algbw_gbs = r.busbw_gbs = 0;
  if (r.time_median_s > 0) {
    r.algbw_gbs = double(r.bytes) / r.time_median_s / kGB;
    r.busbw_gbs = r.algbw_gbs * bus_bandwidth_factor(r.op, r.ranks);
  }
  return r;
}

std::vector<std::int64_t> sweep_counts(std::int64_t min_bytes, std::int64_t max_bytes,
                                       double factor, Dtype dtype) {
  if (min_bytes < 0 || max_bytes < min_bytes || !(factor > 1.0))
    throw InputError("collective sweep: need 0 <= min_bytes <= max_bytes and a step factor > 1");
  const std::int64_t esize = bytes_of(dtype);
  std::vector<std::int64_t> counts;
  for (double bytes = double(min_bytes); bytes < double(max_bytes);
       bytes = std::max(bytes * factor, bytes + 1))
    counts.push_back(std::int64_t(bytes) / esize);
  counts.push_back(max_bytes / esize);
  // Small sizes can round to the same count; keep each once.
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

std::string nccl_table_header(const CollectiveResult& first) {
  char line[256];
  const std::string at_once =
      first.groups > 1 ? ", " + std::to_string(first.groups) + " groups at once" : "";
  std::snprintf(line, sizeof line, "# %s on %s (%d ranks%s)%s\n", to_string(first.op),
                first.group.c_str(), first.ranks, at_once.c_str(),
                first.in_place ? ", in place" : "");
  std::string out = line;
  std::snprintf(line, sizeof line, "#%13s %13s %7s %7s %10s %8s %8s %7s\n", "size", "count", "type",
                "redop", "time", "algbw", "busbw", "#wrong");
  out += line;
  std::snprintf(line, sizeof line, "#%13s %13s %7s %7s %10s %8s %8s %7s\n", "(B)", "(elements)", "",
                "", "(us)", "(GB/s)", "(GB/s)", "");
  return out + line;
}

std::string nccl_table_row(const CollectiveResult& r) {
  char line[256];
  std::snprintf(line, sizeof line, " %13lld %13lld %7s %7s %10.2f %8.2f %8.2f %7lld\n",
                static_cast<long long>(r.bytes), static_cast<long long>(r.count), to_string(r.dtype),
                redop_name(r), r.time_median_s * 1e6, r.algbw_gbs, r.busbw_gbs,
                static_cast<long long>(r.wrong));
  return line;
}

std::string format_nccl_table(const std::vector<CollectiveResult>& results) {
  std::string out;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const bool new_block = i == 0 || r.op != results[i - 1].op || r.group != results[i - 1].group ||
                           r.ranks != results[i - 1].ranks || r.in_place != results[i - 1].in_place ||
                           r.groups != results[i - 1].groups;
    if (new_block) out += nccl_table_header(r);
    out += nccl_table_row(r);
  }
  return out;
}

}  // namespace tedsim
