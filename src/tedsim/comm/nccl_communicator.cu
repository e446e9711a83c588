// The NCCL backend: every CUDA and NCCL call of the comm library lives here.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <map>

#include "tedsim/comm/nccl_communicator.hpp"
#include "tedsim/comm/watchdog.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {

namespace {

ncclDataType_t nccl_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32: return ncclFloat32;
    case Dtype::fp16: return ncclFloat16;
    case Dtype::bf16: return ncclBfloat16;
    case Dtype::fp8: return ncclUint8;  // bytes moved, never reduced (the step keeps fp8 out of collectives)
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

void check_cuda(cudaError_t err, const std::string& where, const char* what) {
  if (err != cudaSuccess)
    throw RunError(where + ": " + what + " failed: " + cudaGetErrorString(err));
}

class DeviceBuffer final : public CommBuffer {
 public:
  DeviceBuffer(std::size_t bytes, cudaStream_t stream, std::string where)
      : bytes_(bytes), stream_(stream), where_(std::move(where)) {
    if (bytes_) check_cuda(cudaMalloc(&data_, bytes_), where_, "cudaMalloc");
  }
  ~DeviceBuffer() override {
    if (data_) cudaFree(data_);
  }
  void* data() override { return data_; }
  std::size_t bytes() const override { return bytes_; }
  // Copies go on the communicator's stream (a non-blocking stream does not order against the
  // legacy default stream, so a plain cudaMemcpy could race an in-flight collective).
  void upload(const void* host, std::size_t bytes, std::size_t offset) override {
    bounds(bytes, offset);
    if (!bytes) return;
    check_cuda(cudaMemcpyAsync(static_cast<char*>(data_) + offset, host, bytes,
                               cudaMemcpyHostToDevice, stream_), where_, "cudaMemcpyAsync H2D");
    check_cuda(cudaStreamSynchronize(stream_), where_, "cudaStreamSynchronize");
  }
  void download(void* host, std::size_t bytes, std::size_t offset) const override {
    bounds(bytes, offset);
    if (!bytes) return;
    check_cuda(cudaMemcpyAsync(host, static_cast<const char*>(data_) + offset, bytes,
                               cudaMemcpyDeviceToHost, stream_), where_, "cudaMemcpyAsync D2H");
    check_cuda(cudaStreamSynchronize(stream_), where_, "cudaStreamSynchronize");
  }

 private:
  void bounds(std::size_t bytes, std::size_t offset) const {
    if (offset > bytes_ || bytes > bytes_ - offset)
      throw InputError(where_ + ": device buffer of " + std::to_string(bytes_) + " bytes: copy of " +
                       std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                       " runs past its end");
  }
  void* data_ = nullptr;
  std::size_t bytes_;
  cudaStream_t stream_;
  std::string where_;
};

// Events on the communicator's stream time the transfer itself, not the host's enqueue. The stop
// waits through the communicator, so the watchdog watches it.
class EventTimer final : public CommTimer {
 public:
  EventTimer(NcclCommunicator& owner, cudaStream_t stream, std::string where)
      : owner_(owner), stream_(stream), where_(std::move(where)) {
    check_cuda(cudaEventCreate(&start_), where_, "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), where_, "cudaEventCreate");
  }
  ~EventTimer() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start() override { check_cuda(cudaEventRecord(start_, stream_), where_, "cudaEventRecord"); }
  void stop() override {
    check_cuda(cudaEventRecord(stop_, stream_), where_, "cudaEventRecord");
    owner_.wait();
  }
  double seconds() const override {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), where_, "cudaEventElapsedTime");
    return double(ms) * 1e-3;
  }

 private:
  NcclCommunicator& owner_;
  cudaStream_t stream_;
  std::string where_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

// One direction between two ranks for pipeline point-to-point: a two-rank NCCL communicator of its
// own (the sender is its rank 0, the receiver its rank 1) and a stream of its own. NCCL runs the
// operations of one communicator in the order they were issued, so a single communicator for both
// directions would make a rank's receive wait behind its own earlier sends; two neighbours that
// each send before they receive (the pipeline's steady state) would then wait on each other.
// PyTorch's ProcessGroupNCCL keeps a communicator per pair for its point-to-point for the same
// reason; one per direction also frees the schedule from ordering sends against receives.
struct P2pLane {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int abort_hook = 0;
  void release() {
    if (abort_hook) watchdog::remove_abort_hook(abort_hook);
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

struct NcclCommunicator::Impl {
  std::unique_ptr<MpiCommunicator> mpi;  // bootstrap, host reductions, splitting
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  const char* pending = "nccl work";  // the last call enqueued: what a stuck wait() waits for
  int abort_hook = 0;                 // the watchdog's ncclCommAbort of this communicator
  // Point-to-point (prepare_point_to_point): the lanes to and from each ring neighbour, by its
  // rank, and an event per send still in flight, by ticket.
  bool p2p_ready = false;
  std::map<int, P2pLane> to, from;
  std::map<std::uint64_t, cudaEvent_t> sends;
  std::uint64_t next_ticket = 1;
  // Releases here rather than in ~NcclCommunicator so a constructor that throws half-way still
  // frees what it made. No throwing: finish outstanding work, then release in reverse order.
  ~Impl() {
    for (auto& [peer, lane] : to) lane.release();
    for (auto& [peer, lane] : from) lane.release();
    for (auto& [ticket, event] : sends) cudaEventDestroy(event);
    if (abort_hook) watchdog::remove_abort_hook(abort_hook);
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

void check_nccl(ncclResult_t rc, ncclComm_t comm, const std::string& where, const char* what) {
  if (rc == ncclSuccess) return;
  std::string detail = ncclGetErrorString(rc);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string(": ") + last;
  }
  throw RunError(where + ": " + what + " failed: " + detail);
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> bootstrap)
    : Communicator(bootstrap->name()), impl_(std::make_unique<Impl>()) {
  impl_->mpi = std::move(bootstrap);
  MpiCommunicator& mpi = *impl_->mpi;
  // Rank 0 sends its status with the id: if ncclGetUniqueId failed there, the other ranks learn
  // it from the broadcast and throw too, instead of waiting in ncclCommInitRank forever.
  struct {
    int ok;
    ncclUniqueId id;
  } boot{};
  std::string root_error;
  if (mpi.rank() == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&boot.id);
    boot.ok = rc == ncclSuccess;
    if (!boot.ok) root_error = ncclGetErrorString(rc);
  }
  mpi.check(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, mpi.handle()), "MPI_Bcast (ncclUniqueId)");
  if (!boot.ok)
    throw RunError(where() + ": ncclGetUniqueId failed on group rank 0" +
                   (root_error.empty() ? std::string() : ": " + root_error));
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), where(),
             "cudaStreamCreateWithFlags");
  {
    const watchdog::WatchedCall watched(mpi.call_site("ncclCommInitRank"));
    check_nccl(ncclCommInitRank(&impl_->comm, mpi.size(), boot.id, mpi.rank()), nullptr, where(),
               "ncclCommInitRank");
  }
  // A timed-out wait leaves kernels spinning on the device; aborting the communicator stops them
  // (what PyTorch's NCCL watchdog does) before the job is ended.
  ncclComm_t comm = impl_->comm;
  impl_->abort_hook = watchdog::add_abort_hook([comm] { ncclCommAbort(comm); });
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return impl_->mpi->rank(); }
int NcclCommunicator::size() const { return impl_->mpi->size(); }

void NcclCommunicator::all_reduce(const void* send, void* recv, std::size_t count, Dtype dtype,
                                  ReduceOp op) {
  impl_->pending = "all_reduce";
  check_nccl(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), impl_->comm,
                           impl_->stream), impl_->comm, where(), "ncclAllReduce");
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t send_count,
                                  Dtype dtype) {
  impl_->pending = "all_gather";
  check_nccl(ncclAllGather(send, recv, send_count, nccl_type(dtype), impl_->comm, impl_->stream),
             impl_->comm, where(), "ncclAllGather");
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                      Dtype dtype, ReduceOp op) {
  impl_->pending = "reduce_scatter";
  check_nccl(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), impl_->comm,
                               impl_->stream), impl_->comm, where(), "ncclReduceScatter");
}

void NcclCommunicator::all_to_all(const void* send, void* recv, std::size_t count_per_peer,
                                  Dtype dtype) {
  if (send == recv && count_per_peer)
    throw InputError(where() + ": all_to_all cannot run in place");
  impl_->pending = "all_to_all";
  // Grouped point-to-point is NCCL's all-to-all on every version (ncclAlltoAll is 2.28+ only).
  const std::size_t chunk = count_per_peer * std::size_t(bytes_of(dtype));
  const auto* src = static_cast<const char*>(send);
  auto* dst = static_cast<char*>(recv);
  check_nccl(ncclGroupStart(), impl_->comm, where(), "ncclGroupStart");
  for (int peer = 0; peer < size(); ++peer) {
    check_nccl(ncclSend(src + std::size_t(peer) * chunk, count_per_peer, nccl_type(dtype), peer,
                        impl_->comm, impl_->stream), impl_->comm, where(), "ncclSend");
    check_nccl(ncclRecv(dst + std::size_t(peer) * chunk, count_per_peer, nccl_type(dtype), peer,
                        impl_->comm, impl_->stream), impl_->comm, where(), "ncclRecv");
  }
  check_nccl(ncclGroupEnd(), impl_->comm, where(), "ncclGroupEnd");
}

void NcclCommunicator::all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                                    const std::vector<std::size_t>& recv_counts, Dtype dtype) {
  if (int(send_counts.size()) != size() || int(recv_counts.size()) != size())
    throw InputError(where() + ": all_to_all_v needs one send and one receive count per rank");
  if (send == recv) throw InputError(where() + ": all_to_all_v cannot run in place");
  impl_->pending = "all_to_all_v";
  const std::size_t esize = std::size_t(bytes_of(dtype));
  const auto* src = static_cast<const char*>(send);
  auto* dst = static_cast<char*>(recv);
  check_nccl(ncclGroupStart(), impl_->comm, where(), "ncclGroupStart");
  std::size_t s_off = 0, r_off = 0;
  for (int peer = 0; peer < size(); ++peer) {
    // Zero-count pairs still post (NCCL accepts count 0), so both sides agree on the pattern.
    check_nccl(ncclSend(src + s_off * esize, send_counts[peer], nccl_type(dtype), peer, impl_->comm, impl_->stream),
               impl_->comm, where(), "ncclSend");
    check_nccl(ncclRecv(dst + r_off * esize, recv_counts[peer], nccl_type(dtype), peer, impl_->comm, impl_->stream),
               impl_->comm, where(), "ncclRecv");
    s_off += send_counts[peer];
    r_off += recv_counts[peer];
  }
  check_nccl(ncclGroupEnd(), impl_->comm, where(), "ncclGroupEnd");
}

void NcclCommunicator::barrier() {
  // A device-side barrier: work queued before it completes on every rank before anyone goes on.
  wait();
  impl_->mpi->barrier();
}

void NcclCommunicator::wait() {
  const watchdog::WatchedCall watched(impl_->mpi->call_site(impl_->pending));
  check_cuda(cudaStreamSynchronize(impl_->stream), where(), "cudaStreamSynchronize");
}

// Every rank opens its lanes in one global order, pair (i, i + 1 mod n) for i = 0, 1, ..., each
// direction in turn; a rank waits in each opening only for the one partner of that lane, who
// reaches it next in the same order, so no two openings wait on each other.
void NcclCommunicator::prepare_point_to_point() {
  if (impl_->p2p_ready) return;
  impl_->p2p_ready = true;
  const int n = size(), me = rank();
  MpiCommunicator& mpi = *impl_->mpi;
  auto open_lane = [&](int sender, int receiver) {
    const bool sending = me == sender;
    std::map<int, P2pLane>& lanes = sending ? impl_->to : impl_->from;
    const int peer = sending ? receiver : sender;
    if (lanes.count(peer)) return;  // with two ranks, pair (1, 0) is pair (0, 1)
    P2pLane& lane = lanes[peer];
    struct {
      int ok;
      ncclUniqueId id;
    } boot{};
    if (sending) {
      boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess;
      mpi.check(MPI_Send(&boot, int(sizeof boot), MPI_BYTE, receiver, 1, mpi.handle()), "MPI_Send (ncclUniqueId)");
    } else {
      mpi.check(MPI_Recv(&boot, int(sizeof boot), MPI_BYTE, sender, 1, mpi.handle(), MPI_STATUS_IGNORE),
                "MPI_Recv (ncclUniqueId)");
    }
    const std::string what = "point-to-point lane from group rank " + std::to_string(sender) + " to " +
                             std::to_string(receiver);
    if (!boot.ok) throw RunError(where() + ": " + what + ": ncclGetUniqueId failed on the sender");
    check_cuda(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), where(), "cudaStreamCreateWithFlags");
    {
      const watchdog::WatchedCall watched(mpi.call_site("ncclCommInitRank (point-to-point)"));
      check_nccl(ncclCommInitRank(&lane.comm, 2, boot.id, sending ? 0 : 1), nullptr, where() + ": " + what,
                 "ncclCommInitRank");
    }
    ncclComm_t comm = lane.comm;
    lane.abort_hook = watchdog::add_abort_hook([comm] { ncclCommAbort(comm); });
  };
  for (int i = 0; i < n && n > 1; ++i) {
    const int j = (i + 1) % n;
    if (me == i || me == j) {
      open_lane(i, j);
      open_lane(j, i);
    }
  }
}

namespace {

P2pLane& lane_of(std::map<int, P2pLane>& lanes, int peer, bool ready, const std::string& where, const char* what) {
  auto found = lanes.find(peer);
  if (found != lanes.end()) return found->second;
  throw RunError(where + ": " + what + " group rank " + std::to_string(peer) +
                 (ready ? ": NCCL point-to-point runs between ring neighbours (rank +- 1) only"
                        : ": prepare_point_to_point() was not called on this communicator"));
}

}  // namespace

// The lane's stream waits for what this communicator's stream holds, and a send is an event on the
// lane: the caller's buffer is written before it leaves and free again when the event has passed.
std::uint64_t NcclCommunicator::send(const void* buf, std::size_t count, Dtype dtype, int peer) {
  P2pLane& lane = lane_of(impl_->to, peer, impl_->p2p_ready, where(), "send to");
  cudaEvent_t ready = nullptr, sent = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), where(), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(ready, impl_->stream), where(), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(lane.stream, ready, 0), where(), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);
  check_nccl(ncclSend(buf, count, nccl_type(dtype), 1, lane.comm, lane.stream), lane.comm, where(), "ncclSend");
  check_cuda(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), where(), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(sent, lane.stream), where(), "cudaEventRecord");
  const std::uint64_t ticket = impl_->next_ticket++;
  impl_->sends[ticket] = sent;
  return ticket;
}

bool NcclCommunicator::send_done(std::uint64_t ticket) {
  auto found = impl_->sends.find(ticket);
  if (found == impl_->sends.end()) return true;
  const cudaError_t state = cudaEventQuery(found->second);
  if (state == cudaErrorNotReady) return false;
  check_cuda(state, where(), "cudaEventQuery (send)");
  cudaEventDestroy(found->second);
  impl_->sends.erase(found);
  return true;
}

void NcclCommunicator::recv(void* buf, std::size_t count, Dtype dtype, int peer) {
  P2pLane& lane = lane_of(impl_->from, peer, impl_->p2p_ready, where(), "receive from");
  check_nccl(ncclRecv(buf, count, nccl_type(dtype), 0, lane.comm, lane.stream), lane.comm, where(), "ncclRecv");
  const watchdog::WatchedCall watched(impl_->mpi->call_site("recv"));
  check_cuda(cudaStreamSynchronize(lane.stream), where(), "cudaStreamSynchronize (recv)");
}

void NcclCommunicator::wait_sends() {
  {
    const watchdog::WatchedCall watched(impl_->mpi->call_site("wait for sends"));
    for (auto& [peer, lane] : impl_->to)
      check_cuda(cudaStreamSynchronize(lane.stream), where(), "cudaStreamSynchronize (sends)");
  }
  for (auto& [ticket, event] : impl_->sends) cudaEventDestroy(event);
  impl_->sends.clear();
}

std::unique_ptr<Communicator> NcclCommunicator::split(const std::vector<int>& members,
                                                      const std::string& name) {
  return std::make_unique<NcclCommunicator>(impl_->mpi->split_mpi(members, name));
}

std::unique_ptr<CommBuffer> NcclCommunicator::make_buffer(std::size_t bytes) {
  return std::make_unique<DeviceBuffer>(bytes, impl_->stream, where());
}

std::unique_ptr<CommTimer> NcclCommunicator::make_timer() {
  return std::make_unique<EventTimer>(*this, impl_->stream, where());
}

void NcclCommunicator::host_max(std::vector<double>& values) { impl_->mpi->host_max(values); }
std::int64_t NcclCommunicator::host_sum(std::int64_t value) { return impl_->mpi->host_sum(value); }

}  // namespace tedsim
