#pragma once
// Collectives over host memory with MPI. fp32 maps to MPI_FLOAT; fp16/bf16 travel as 16-bit words
// and are reduced by tedsim's own MPI operations (MPI has no half types), each partial sum
// rounded to 16 bits as NCCL does.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/watchdog.hpp"

namespace tedsim {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD or
  // MPI_COMM_SELF. Errors on it are returned, not fatal, so they become RunErrors.
  MpiCommunicator(MPI_Comm comm, std::string name);
  // A private duplicate of MPI_COMM_WORLD, so tedsim's traffic never matches the caller's.
  static std::unique_ptr<MpiCommunicator> world();
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::cpu; }
  const char* backend_name() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

  void all_reduce(const void* send, void* recv, std::size_t count, Dtype dtype,
                  ReduceOp op = ReduceOp::sum) override;
  void all_gather(const void* send, void* recv, std::size_t send_count, Dtype dtype) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, Dtype dtype,
                      ReduceOp op = ReduceOp::sum) override;
  void all_to_all(const void* send, void* recv, std::size_t count_per_peer, Dtype dtype) override;
  void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, Dtype dtype) override;  // MPI_Alltoallv
  void barrier() override;
  void wait() override {}  // MPI collectives here are blocking: nothing is left in flight
  void prepare_point_to_point() override {}  // MPI matches messages between any two ranks
  std::uint64_t send(const void* buf, std::size_t count, Dtype dtype, int peer) override;  // MPI_Isend
  bool send_done(std::uint64_t ticket) override;                                           // MPI_Test
  void recv(void* buf, std::size_t count, Dtype dtype, int peer) override;                 // MPI_Recv
  void wait_sends() override;                                                              // MPI_Waitall

  std::unique_ptr<Communicator> split(const std::vector<int>& members,
                                      const std::string& name) override;
  // The MPI sub-communicator itself, for backends that bootstrap over it (NCCL).
  std::unique_ptr<MpiCommunicator> split_mpi(const std::vector<int>& members,
                                             const std::string& name);

  std::unique_ptr<CommBuffer> make_buffer(std::size_t bytes) override;
  std::unique_ptr<CommTimer> make_timer() override;
  void host_max(std::vector<double>& values) override;
  std::int64_t host_sum(std::int64_t value) override;

  // Throws RunError naming host, rank and the MPI error text unless `code` is MPI_SUCCESS.
  void check(int code, const char* what) const;
  // The world rank of each member, in group order (what the watchdog's messages name).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // Brackets one blocking call under the collective watchdog (watchdog.hpp).
  watchdog::CallSite call_site(const char* op) {
    return {op, &name(), &world_ranks_, rank_, size_, ++calls_};
  }

 private:
  int checked_count(std::size_t count, const char* what) const;

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::uint64_t calls_ = 0;  // blocking calls so far, numbered for the watchdog
  std::map<std::uint64_t, MPI_Request> sends_;  // by ticket
  std::uint64_t next_ticket_ = 1;
};

}  // namespace tedsim
