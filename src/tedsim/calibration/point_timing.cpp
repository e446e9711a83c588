#include "tedsim/calibration/point_timing.hpp"

#include <mpi.h>

#include <algorithm>
#include <ctime>
#include <map>

#include "tedsim/calibration/provenance.hpp"
#include "tedsim/calibration/sweep.hpp"
#include "tedsim/core/build_info.hpp"

namespace tedsim::calibration {

void gather_hosts(Provenance& p) {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(std::size_t(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::map<std::string, int> per_host;
  std::vector<std::string> host_of_rank;
  for (int r = 0; r < size; ++r) {
    host_of_rank.emplace_back(&all[std::size_t(r) * MPI_MAX_PROCESSOR_NAME]);
    if (per_host[host_of_rank.back()]++ == 0) p.hosts.push_back(host_of_rank.back());
  }
  require_block_placement(host_of_rank);  // every rank sees the same names, so all agree
  p.ranks = size;
  p.ranks_per_node = 1;
  for (const auto& [h, n] : per_host) p.ranks_per_node = std::max(p.ranks_per_node, n);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  MPI_Get_library_version(lib, &len);
  std::string mpi(lib, std::size_t(len));
  if (const auto nl = mpi.find_first_of("\n,"); nl != std::string::npos) mpi = mpi.substr(0, nl);
  p.mpi = mpi;
}

Timing summarize(std::vector<double> s) {
  std::sort(s.begin(), s.end());
  Timing t;
  t.min_s = s.front();
  t.max_s = s.back();
  t.median_s = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  return t;
}

Timing slowest(Communicator& world, const Timing& t) {
  std::vector<double> v{t.min_s, t.median_s, t.max_s};
  world.host_max(v);
  return Timing{v[0], v[1], v[2]};
}

namespace {
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

Provenance describe_this_run(Backend backend, const Bench& bench) {
  Provenance p;
  gather_hosts(p);
  p.backend = to_string(backend);
  p.cpu_model = cpu_model_name();
  p.date = utc_now();
  p.tedsim_version = build_info::version;
  p.build_flags = build_info::flags;
  p.devices = {bench.device_name()};
  if (backend == Backend::cuda) add_cuda_provenance(p);
  return p;
}

void require_correct(Communicator& world, std::int64_t wrong, const std::string& what) {
  const std::int64_t total = world.host_sum(wrong);
  if (total != 0)
    throw RunError(world.where() + ": " + what + " differs from its CPU reference in " + std::to_string(total) +
                   " elements (summed over ranks); not timing a wrong kernel");
}

Timing measure_steady(const std::function<Timing()>& once, double spread_limit) {
  Timing best = once();
  for (int attempt = 0; attempt < 2 && best.max_s > spread_limit * best.min_s; ++attempt) {
    const Timing again = once();
    if (again.max_s / again.min_s < best.max_s / best.min_s) best = again;
  }
  return best;
}

}  // namespace tedsim::calibration
