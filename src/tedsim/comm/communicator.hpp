#pragma once
// The Communicator interface: the collectives a TED step runs, over one process group, on one
// backend (MPI over host memory, or NCCL over device memory). Calibration times these calls and
// the runtime's training step makes them, so both exercise the same code.
//
// Conventions (NCCL's, so the GPU backend is a thin wrapper):
// - counts are elements of `dtype`; buffers belong to the backend (host memory for MPI, device
//   memory for NCCL; make_buffer() gives the right kind);
// - all_gather takes the per-rank send count; reduce_scatter the per-rank receive count;
//   all_to_all the count sent to each peer (rank i's chunk j goes to rank j's chunk i);
// - in place: all_reduce with send == recv; all_gather with send == recv + rank*count;
//   reduce_scatter with recv == send + rank*count; all_to_all cannot run in place;
// - calls may return before the data has moved (NCCL enqueues on a stream): wait() blocks until
//   every collective issued so far has completed, which is what a timer must bracket.
// No MPI, CUDA or NCCL header is visible here: CPU-only code includes this freely.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tedsim/core/units.hpp"

namespace tedsim {

enum class Backend { cpu, cuda };
const char* to_string(Backend backend);
Backend parse_backend(const std::string& text);  // "cpu" or "cuda"; throws InputError

enum class ReduceOp { sum, max };
const char* to_string(ReduceOp op);

// A buffer the communicator can send from and receive into.
class CommBuffer {
 public:
  virtual ~CommBuffer() = default;
  virtual void* data() = 0;
  virtual std::size_t bytes() const = 0;
  // Copies between this buffer and host memory (a memcpy for host buffers). Blocking.
  virtual void upload(const void* host, std::size_t bytes, std::size_t offset = 0) = 0;
  virtual void download(void* host, std::size_t bytes, std::size_t offset = 0) const = 0;
};

// Brackets collectives for timing on the backend's own clock: MPI_Wtime for MPI, CUDA events on
// the communicator's stream for NCCL (host clocks would time the enqueue, not the transfer).
class CommTimer {
 public:
  virtual ~CommTimer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;               // waits for the bracketed work to finish
  virtual double seconds() const = 0;    // between the last start() and stop()
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  virtual const char* backend_name() const = 0;  // "mpi" or "nccl"
  const std::string& name() const { return name_; }  // "world", "tensor", ... for messages
  // "host <h> world rank <r>, <name> rank <i>/<n> (<backend>)": prefix of every error message,
  // because many ranks write one log.
  std::string where() const;

  virtual void all_reduce(const void* send, void* recv, std::size_t count, Dtype dtype,
                          ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_gather(const void* send, void* recv, std::size_t send_count, Dtype dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, Dtype dtype,
                              ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_to_all(const void* send, void* recv, std::size_t count_per_peer,
                          Dtype dtype) = 0;
  // Uneven all-to-all (dropless dispatch): send_counts[j] elements go to rank j, packed in rank
  // order in `send`; recv_counts[j] arrive from rank j, packed in rank order in `recv`. Each
  // rank's send_counts[j] must equal rank j's recv_counts[this rank]. Not in place.
  virtual void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                            const std::vector<std::size_t>& recv_counts, Dtype dtype) = 0;
  virtual void barrier() = 0;
  // Blocks until every collective issued on this communicator has completed.
  virtual void wait() = 0;

  // Point-to-point between two ranks of this communicator (pipeline neighbours). Collective over
  // this communicator, once, before the first send or recv: sets up what messages between ring
  // neighbours (rank +- 1 modulo the size) need; the NCCL backend sends between those only.
  virtual void prepare_point_to_point() = 0;
  // `send` may return before the data has left: `buf` stays untouched until send_done(ticket) or
  // wait_sends() says so. `recv` blocks until the data is there. Messages from one rank to another
  // arrive in the order they were sent.
  virtual std::uint64_t send(const void* buf, std::size_t count, Dtype dtype, int peer) = 0;
  virtual bool send_done(std::uint64_t ticket) = 0;
  virtual void recv(void* buf, std::size_t count, Dtype dtype, int peer) = 0;
  virtual void wait_sends() = 0;

  // A sub-communicator of the ranks in `members` (ranks of this communicator, increasing order;
  // the new ranks follow it). Collective over this communicator: every rank calls it, each with
  // the member list of its own group, and the lists must partition the ranks.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& members,
                                              const std::string& name) = 0;

  virtual std::unique_ptr<CommBuffer> make_buffer(std::size_t bytes) = 0;
  virtual std::unique_ptr<CommTimer> make_timer() = 0;

  // Control-plane reductions on host values (timings, error counts), whatever the data backend:
  // NCCL only reduces device memory, so the NCCL backend sends these over its MPI bootstrap.
  virtual void host_max(std::vector<double>& values) = 0;
  virtual std::int64_t host_sum(std::int64_t value) = 0;

 protected:
  explicit Communicator(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

// "host <h> world rank <r>": where this process is, for errors raised before any communicator
// exists (or outside one).
std::string process_location();

// Builds the communicator over every MPI rank for `backend`; MPI must be initialised.
// cuda: selects this rank's device (local rank modulo device count) and bootstraps NCCL over MPI;
// throws RunError("no CUDA device: ...") when there is none, or when tedsim was built without
// CUDA/NCCL, rather than crashing inside the CUDA runtime.
std::unique_ptr<Communicator> make_world_communicator(Backend backend);

// CUDA devices this process can use; when 0, `why` says why (no driver, no device, built
// without CUDA). Never throws.
int cuda_device_count(std::string* why = nullptr);
inline bool cuda_device_available(std::string* why = nullptr) { return cuda_device_count(why) > 0; }

}  // namespace tedsim
