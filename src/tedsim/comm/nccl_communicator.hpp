#pragma once
// Collectives over device memory with NCCL, on one CUDA stream per communicator. Bootstrapped over
// MPI: rank 0 of the group makes the ncclUniqueId and broadcasts it over the group's MPI
// communicator, which is kept for host-side reductions and for splitting.
// Opaque on purpose: no CUDA or NCCL header is visible to code that includes this one.
// Built only when tedsim finds NCCL (TEDSIM_COMM_HAVE_NCCL).
#include <memory>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/mpi_communicator.hpp"

namespace tedsim {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`; the CUDA device must already be selected (see cuda_device.hpp).
  explicit NcclCommunicator(std::unique_ptr<MpiCommunicator> bootstrap);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  Backend backend() const override { return Backend::cuda; }
  const char* backend_name() const override { return "nccl"; }

  void all_reduce(const void* send, void* recv, std::size_t count, Dtype dtype,
                  ReduceOp op = ReduceOp::sum) override;
  void all_gather(const void* send, void* recv, std::size_t send_count, Dtype dtype) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, Dtype dtype,
                      ReduceOp op = ReduceOp::sum) override;
  void all_to_all(const void* send, void* recv, std::size_t count_per_peer, Dtype dtype) override;
  void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, Dtype dtype) override;  // grouped send/recv
  void barrier() override;
  void wait() override;  // cudaStreamSynchronize on this communicator's stream
  // Pipeline point-to-point: a two-rank NCCL communicator and a stream per direction to each ring
  // neighbour, opened by prepare_point_to_point(); a send is an event on its lane's stream.
  void prepare_point_to_point() override;
  std::uint64_t send(const void* buf, std::size_t count, Dtype dtype, int peer) override;
  bool send_done(std::uint64_t ticket) override;
  void recv(void* buf, std::size_t count, Dtype dtype, int peer) override;
  void wait_sends() override;

  std::unique_ptr<Communicator> split(const std::vector<int>& members,
                                      const std::string& name) override;
  std::unique_ptr<CommBuffer> make_buffer(std::size_t bytes) override;  // device memory
  std::unique_ptr<CommTimer> make_timer() override;                     // CUDA events
  void host_max(std::vector<double>& values) override;
  std::int64_t host_sum(std::int64_t value) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tedsim
