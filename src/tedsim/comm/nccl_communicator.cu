// The NCCL backend: every CUDA and NCCL call of the comm library lives here.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

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

struct NcclCommunicator::Impl {
  std::unique_ptr<MpiCommunicator> mpi;  // bootstrap, host reductions, splitting
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  const char* pending = "nccl work";  // the last call enqueued: what a stuck wait() waits for
  int abort_hook = 0;                 // the watchdog's ncclCommAbort of this communicator
  // Releases here rather than in ~NcclCommunicator so a constructor that throws half-way still
  // frees what it made. No throwing: finish outstanding work, then release in reverse order.
  ~Impl() {
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

std::uint64_t NcclCommunicator::send(const void*, std::size_t, Dtype, int peer) {
  throw RunError(where() + ": pipeline send to rank " + std::to_string(peer) +
                 ": point-to-point over NCCL is not built yet (pipeline stages run on the CPU backend)");
}

void NcclCommunicator::recv(void*, std::size_t, Dtype, int peer) {
  throw RunError(where() + ": pipeline receive from rank " + std::to_string(peer) +
                 ": point-to-point over NCCL is not built yet (pipeline stages run on the CPU backend)");
}

void NcclCommunicator::wait_sends() {}

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
