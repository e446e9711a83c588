#include "tedsim/comm/mpi_communicator.hpp"

#include <climits>
#include <cstring>
#include <vector>

#include "tedsim/comm/mpi_types.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {

namespace {

class HostBuffer final : public CommBuffer {
 public:
  HostBuffer(std::size_t bytes, std::string where) : data_(bytes), where_(std::move(where)) {}
  void* data() override { return data_.data(); }
  std::size_t bytes() const override { return data_.size(); }
  void upload(const void* host, std::size_t bytes, std::size_t offset) override {
    bounds(bytes, offset);
    if (bytes) std::memcpy(data_.data() + offset, host, bytes);
  }
  void download(void* host, std::size_t bytes, std::size_t offset) const override {
    bounds(bytes, offset);
    if (bytes) std::memcpy(host, data_.data() + offset, bytes);
  }

 private:
  void bounds(std::size_t bytes, std::size_t offset) const {
    if (offset > data_.size() || bytes > data_.size() - offset)
      throw InputError(where_ + ": host buffer of " + std::to_string(data_.size()) +
                       " bytes: copy of " + std::to_string(bytes) + " bytes at offset " +
                       std::to_string(offset) + " runs past its end");
  }
  std::vector<std::byte> data_;  // operator new aligns to 16 bytes, enough for MPI and SIMD loads
  std::string where_;
};

class WtimeTimer final : public CommTimer {
 public:
  void start() override { t0_ = MPI_Wtime(); }
  void stop() override { t1_ = MPI_Wtime(); }
  double seconds() const override { return t1_ - t0_; }

 private:
  double t0_ = 0, t1_ = 0;
};

bool predefined(MPI_Comm comm) { return comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF; }

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : Communicator(std::move(name)), comm_(comm) {
  // Errors must come back as codes so they can be reported with host and rank, not abort the job.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<std::size_t>(size_));
  for (int i = 0; i < size_; ++i) ranks[std::size_t(i)] = i;
  world_ranks_.resize(std::size_t(size_));
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw RunError(process_location() + ": MPI communicator: MPI_Init has not been called");
  MPI_Comm dup;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (rc != MPI_SUCCESS)
    throw RunError(process_location() + ": MPI communicator: MPI_Comm_dup(MPI_COMM_WORLD) failed");
  return std::make_unique<MpiCommunicator>(dup, "world");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing after MPI_Finalize is erroneous; MPI has released everything by then anyway.
  if (!finalized && !predefined(comm_) && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check(int code, const char* what) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw RunError(where() + ": " + what + " failed: " + std::string(text, std::size_t(len)));
}

int MpiCommunicator::checked_count(std::size_t count, const char* what) const {
  // MPI-3 counts are int; larger messages would need derived types, which no TED step needs.
  if (count > std::size_t(INT_MAX))
    throw RunError(where() + ": " + what + " of " + std::to_string(count) +
                   " elements exceeds MPI's int count limit (" + std::to_string(INT_MAX) + ")");
  return int(count);
}

void MpiCommunicator::all_reduce(const void* send, void* recv, std::size_t count, Dtype dtype,
                                 ReduceOp op) {
  const int n = checked_count(count, "all_reduce");
  const void* src = send == recv ? MPI_IN_PLACE : send;
  const watchdog::WatchedCall watched(call_site("all_reduce"));
  check(MPI_Allreduce(src, recv, n, mpi_datatype(dtype), mpi_op(op, dtype), comm_), "MPI_Allreduce");
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t send_count,
                                 Dtype dtype) {
  const int n = checked_count(send_count, "all_gather");
  const auto t = mpi_datatype(dtype);
  // NCCL's in-place form (send already at recv + rank*count) is exactly MPI_IN_PLACE's.
  const auto* own = static_cast<const char*>(recv) + std::size_t(rank_) * send_count * bytes_of(dtype);
  const void* src = send == own ? MPI_IN_PLACE : send;
  const watchdog::WatchedCall watched(call_site("all_gather"));
  check(MPI_Allgather(src, n, t, recv, n, t, comm_), "MPI_Allgather");
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                     Dtype dtype, ReduceOp op) {
  const int n = checked_count(recv_count, "reduce_scatter");
  checked_count(recv_count * std::size_t(size_), "reduce_scatter input");
  const auto t = mpi_datatype(dtype);
  const std::size_t chunk = recv_count * bytes_of(dtype);
  const auto* own = static_cast<const char*>(send) + std::size_t(rank_) * chunk;
  const watchdog::WatchedCall watched(call_site("reduce_scatter"));
  if (recv == own) {
    // NCCL's in-place form leaves the result at send + rank*chunk; MPI_IN_PLACE leaves it at the
    // start of the buffer. Reduce in place, then move the result to where NCCL would put it.
    void* base = const_cast<void*>(send);
    check(MPI_Reduce_scatter_block(MPI_IN_PLACE, base, n, t, mpi_op(op, dtype), comm_),
          "MPI_Reduce_scatter_block");
    if (rank_ != 0 && chunk) std::memmove(recv, base, chunk);
    return;
  }
  check(MPI_Reduce_scatter_block(send, recv, n, t, mpi_op(op, dtype), comm_),
        "MPI_Reduce_scatter_block");
}

void MpiCommunicator::all_to_all(const void* send, void* recv, std::size_t count_per_peer,
                                 Dtype dtype) {
  const int n = checked_count(count_per_peer, "all_to_all");
  checked_count(count_per_peer * std::size_t(size_), "all_to_all buffer");
  if (send == recv && count_per_peer)
    throw InputError(where() + ": all_to_all cannot run in place (NCCL has no such form)");
  const auto t = mpi_datatype(dtype);
  const watchdog::WatchedCall watched(call_site("all_to_all"));
  check(MPI_Alltoall(send, n, t, recv, n, t, comm_), "MPI_Alltoall");
}

void MpiCommunicator::all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                                   const std::vector<std::size_t>& recv_counts, Dtype dtype) {
  if (int(send_counts.size()) != size_ || int(recv_counts.size()) != size_)
    throw InputError(where() + ": all_to_all_v needs one send and one receive count per rank");
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  std::size_t s_off = 0, r_off = 0;
  for (int j = 0; j < size_; ++j) {
    sc[j] = checked_count(send_counts[j], "all_to_all_v");
    rc[j] = checked_count(recv_counts[j], "all_to_all_v");
    sd[j] = checked_count(s_off, "all_to_all_v displacement");
    rd[j] = checked_count(r_off, "all_to_all_v displacement");
    s_off += send_counts[j];
    r_off += recv_counts[j];
  }
  if (send == recv && (s_off || r_off)) throw InputError(where() + ": all_to_all_v cannot run in place");
  const auto t = mpi_datatype(dtype);
  const watchdog::WatchedCall watched(call_site("all_to_all_v"));
  check(MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_), "MPI_Alltoallv");
}

void MpiCommunicator::barrier() {
  const watchdog::WatchedCall watched(call_site("barrier"));
  check(MPI_Barrier(comm_), "MPI_Barrier");
}

std::uint64_t MpiCommunicator::send(const void* buf, std::size_t count, Dtype dtype, int peer) {
  MPI_Request request;
  check(MPI_Isend(buf, checked_count(count, "MPI_Isend"), mpi_datatype(dtype), peer, 0, comm_, &request), "MPI_Isend");
  const std::uint64_t ticket = next_ticket_++;
  sends_[ticket] = request;
  return ticket;
}

bool MpiCommunicator::send_done(std::uint64_t ticket) {
  auto it = sends_.find(ticket);
  if (it == sends_.end()) return true;
  int done = 0;
  check(MPI_Test(&it->second, &done, MPI_STATUS_IGNORE), "MPI_Test (send)");
  if (done) sends_.erase(it);
  return done != 0;
}

void MpiCommunicator::recv(void* buf, std::size_t count, Dtype dtype, int peer) {
  const watchdog::WatchedCall watched(call_site("recv"));
  check(MPI_Recv(buf, checked_count(count, "MPI_Recv"), mpi_datatype(dtype), peer, 0, comm_, MPI_STATUS_IGNORE),
        "MPI_Recv");
}

void MpiCommunicator::wait_sends() {
  std::vector<MPI_Request> requests;
  for (auto& [ticket, request] : sends_) requests.push_back(request);
  sends_.clear();
  const watchdog::WatchedCall watched(call_site("wait for sends"));
  if (!requests.empty())
    check(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (sends)");
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_mpi(const std::vector<int>& members,
                                                            const std::string& name) {
  // Checked locally before the collective call: a bad list is a programming error in the caller,
  // and every rank holding one throws rather than entering MPI_Comm_split.
  bool contains_self = false;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= size_ || (i && members[i] <= members[i - 1]))
      throw InputError(where() + ": split '" + name +
                       "': members must be increasing ranks of this communicator");
    contains_self |= members[i] == rank_;
  }
  if (!contains_self)
    throw InputError(where() + ": split '" + name + "': member list does not contain this rank");
  // The smallest member names the group, so every member computes the same colour; the key keeps
  // the parent's order, so group rank i is members[i].
  MPI_Comm sub = MPI_COMM_NULL;
  const watchdog::WatchedCall watched(call_site("split"));
  check(MPI_Comm_split(comm_, members.front(), rank_, &sub), "MPI_Comm_split");
  auto result = std::make_unique<MpiCommunicator>(sub, name);
  // Verify the group really is `members`: lists that do not partition the ranks would otherwise
  // give silently wrong groups.
  std::vector<int> got(std::size_t(result->size()));
  result->check(MPI_Allgather(&rank_, 1, MPI_INT, got.data(), 1, MPI_INT, sub),
                "MPI_Allgather (split check)");
  if (got != members) {
    std::string list;
    for (int r : got) list += (list.empty() ? "" : ",") + std::to_string(r);
    throw RunError(result->where() + ": split '" + name + "' formed group {" + list +
                   "}, not this rank's member list: the lists passed by the ranks disagree");
  }
  return result;
}

std::unique_ptr<Communicator> MpiCommunicator::split(const std::vector<int>& members,
                                                     const std::string& name) {
  return split_mpi(members, name);
}

std::unique_ptr<CommBuffer> MpiCommunicator::make_buffer(std::size_t bytes) {
  return std::make_unique<HostBuffer>(bytes, where());
}

std::unique_ptr<CommTimer> MpiCommunicator::make_timer() { return std::make_unique<WtimeTimer>(); }

void MpiCommunicator::host_max(std::vector<double>& values) {
  const int n = checked_count(values.size(), "host_max");
  const watchdog::WatchedCall watched(call_site("host_max"));
  check(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, MPI_DOUBLE, MPI_MAX, comm_),
        "MPI_Allreduce (host max)");
}

std::int64_t MpiCommunicator::host_sum(std::int64_t value) {
  std::int64_t total = 0;
  const watchdog::WatchedCall watched(call_site("host_sum"));
  check(MPI_Allreduce(&value, &total, 1, MPI_INT64_T, MPI_SUM, comm_), "MPI_Allreduce (host sum)");
  return total;
}

}  // namespace tedsim
