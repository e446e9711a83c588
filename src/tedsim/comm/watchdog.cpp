#include "tedsim/comm/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "tedsim/core/error.hpp"

namespace tedsim::watchdog {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTagRequest = 7101, kTagReply = 7102;
constexpr auto kTick = std::chrono::milliseconds(20);  // how often the open call is checked

enum class State : std::int32_t { computing = 0, in_call = 1, timed_out = 2 };

// What one rank says of itself in the census; plain bytes on the wire.
struct RankStatus {
  std::int32_t world_rank = -1, state = 0, group_rank = 0, group_size = 0;
  std::int64_t number = 0, step = 0, last_number = 0;
  double seconds = 0;  // inside the open call, or since the last one ended
  char op[32] = {}, group[24] = {}, members[112] = {}, last_op[32] = {}, last_group[24] = {}, host[64] = {};
};

template <std::size_t N>
void copy_text(char (&to)[N], const std::string& from) {
  const std::size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

struct Watchdog {
  // Written by the main thread in WatchedCall and at_step, read by the watchdog thread.
  std::mutex mu;
  bool in_call = false, timed_out = false;
  const char* op = "";
  const std::string* group = nullptr;      // the open call's communicator: alive while in_call
  const std::vector<int>* members = nullptr;
  int group_rank = 0, group_size = 1;
  std::uint64_t number = 0;
  Clock::time_point since = Clock::now();
  const char* last_op = nullptr;
  std::string last_group;
  std::uint64_t last_number = 0;
  Clock::time_point last_end = Clock::now();
  long step = 0;

  int depth = 0;  // main thread only
  std::atomic<bool> running{false}, stopping{false};
  double timeout = 0, grace = 1;
  bool census_possible = false;
  FaultInjection fault;
  int rank = 0, size = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<std::string> hosts;
  std::thread thread;

  std::mutex hooks_mu;
  std::map<int, std::function<void()>> hooks;
  int next_hook = 1;

  // Watchdog thread only.
  MPI_Request incoming = MPI_REQUEST_NULL;
  int incoming_buf = 0;
  std::list<std::pair<RankStatus, MPI_Request>> replies;  // sent, not yet complete
  std::set<int> requesters;                              // ranks whose census asked us

  RankStatus snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return snapshot_locked();
  }
  RankStatus snapshot_locked() const {
    RankStatus s;
    s.world_rank = rank;
    s.state = std::int32_t(timed_out ? State::timed_out : in_call ? State::in_call : State::computing);
    s.step = step;
    copy_text(s.host, hosts.empty() ? std::string("?") : hosts[std::size_t(rank)]);
    if (in_call) {
      copy_text(s.op, op);
      copy_text(s.group, *group);
      copy_text(s.members, members_text(*members));
      s.group_rank = group_rank;
      s.group_size = group_size;
      s.number = std::int64_t(number);
      s.seconds = seconds_since(since);
    } else {
      s.seconds = seconds_since(last_end);
    }
    if (last_op) {
      copy_text(s.last_op, last_op);
      copy_text(s.last_group, last_group);
      s.last_number = std::int64_t(last_number);
    }
    return s;
  }

  // Answers every census request that has come in, and reaps finished answers.
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Test(&incoming, &flag, &st);
      if (!flag) break;
      requesters.insert(st.MPI_SOURCE);
      replies.emplace_back(snapshot(), MPI_REQUEST_NULL);
      MPI_Isend(&replies.back().first, int(sizeof(RankStatus)), MPI_BYTE, st.MPI_SOURCE, kTagReply, comm,
                &replies.back().second);
      MPI_Irecv(&incoming_buf, 1, MPI_INT, MPI_ANY_SOURCE, kTagRequest, comm, &incoming);
    }
    for (auto it = replies.begin(); it != replies.end();) {
      int done = 0;
      MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
      it = done ? replies.erase(it) : std::next(it);
    }
  }

  // When the open call has outlasted the timeout: marks it timed out and returns what this rank
  // says of itself with the call's members, in one locked moment (the call may end right after).
  bool overdue(RankStatus& mine, std::vector<int>& group_members) {
    std::lock_guard<std::mutex> lock(mu);
    if (!in_call || timed_out || seconds_since(since) <= timeout) return false;
    timed_out = true;
    mine = snapshot_locked();
    group_members = *members;
    return true;
  }

  std::string host_of(int r) const { return r >= 0 && r < int(hosts.size()) ? hosts[std::size_t(r)] : "?"; }

  [[noreturn]] void end_job(const std::string& message) {
    // On a line of its own: a progress line may be open on stderr.
    std::fputs(("\n" + message).c_str(), stderr);
    std::fflush(stderr);
    {
      std::lock_guard<std::mutex> lock(hooks_mu);
      for (auto& [id, hook] : hooks) hook();
    }
    if (census_possible) MPI_Abort(MPI_COMM_WORLD, int(ExitCode::failure));
    std::_Exit(int(ExitCode::failure));  // a non-zero exit ends the job under mpirun as well
  }

  [[noreturn]] void census_and_end(const RankStatus& mine, const std::vector<int>& group_members);
  void loop();
};

Watchdog& wd() {
  static Watchdog* w = new Watchdog;  // never destroyed: the thread may outlive static destruction
  return *w;
}

// What member `m` was doing instead of this call, in words.
std::string what_instead(const RankStatus& s, const Watchdog& w) {
  const std::string who = "world rank " + std::to_string(s.world_rank) + " on host " + w.host_of(s.world_rank);
  if (State(s.state) == State::computing) {
    std::string last = s.last_op[0] ? std::string("; its last call was ") + s.last_op + " #" +
                                          std::to_string(s.last_number) + " on its " + s.last_group + " group"
                                    : "; it has made no call yet";
    return who + " did not arrive: it is alive but outside any collective for " + fixed1(s.seconds) + " s (step " +
           std::to_string(s.step) + last + "): a hang or a long computation in that rank";
  }
  return who + " did not arrive: it is waiting in " + s.op + " #" + std::to_string(s.number) + " on the " + s.group +
         " group {" + s.members + "} (" + fixed1(s.seconds) + " s, step " + std::to_string(s.step) + ")";
}

void Watchdog::census_and_end(const RankStatus& mine, const std::vector<int>& group_members) {
  std::string header = "tedsim: watchdog: " + std::string(mine.op) + " #" + std::to_string(mine.number) + " on the " +
                       mine.group + " group {" + mine.members + "} has not completed after " + fixed1(mine.seconds) +
                       " s (--timeout " + fixed1(timeout) + " s; world rank " + std::to_string(rank) + " on host " +
                       host_of(rank) + ", step " + std::to_string(mine.step) + ")\n";
  if (!census_possible)
    end_job(header + "  this MPI does not provide MPI_THREAD_MULTIPLE, so the other ranks could not be asked "
                     "where they are\n  ending every rank (exit code 1)\n");

  // Ask everyone; answer others' questions while waiting for the answers.
  std::vector<RankStatus> got(static_cast<std::size_t>(size));
  std::vector<char> have(static_cast<std::size_t>(size), 0);
  std::vector<MPI_Request> asks(static_cast<std::size_t>(size), MPI_REQUEST_NULL), answers(static_cast<std::size_t>(size), MPI_REQUEST_NULL);
  got[std::size_t(rank)] = mine;
  have[std::size_t(rank)] = 1;
  int me = rank, answered = 1;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    MPI_Isend(&me, 1, MPI_INT, q, kTagRequest, comm, &asks[std::size_t(q)]);
    MPI_Irecv(&got[std::size_t(q)], int(sizeof(RankStatus)), MPI_BYTE, q, kTagReply, comm, &answers[std::size_t(q)]);
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace);
  while (answered < size && Clock::now() < deadline) {
    serve();
    for (int q = 0; q < size; ++q) {
      if (have[std::size_t(q)]) continue;
      int flag = 0;
      MPI_Test(&answers[std::size_t(q)], &flag, MPI_STATUS_IGNORE);
      if (flag) have[std::size_t(q)] = 1, ++answered;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // One message: the lowest rank that timed out reports; the others give it time to end the job.
  int reporter = rank;
  for (int q : requesters) reporter = std::min(reporter, q);
  for (int q = 0; q < size; ++q)
    if (have[std::size_t(q)] && State(got[std::size_t(q)].state) == State::timed_out) reporter = std::min(reporter, q);
  std::string preface;
  if (reporter != rank) {
    const auto wait_until = Clock::now() + std::chrono::duration<double>(2 * grace + 2);
    while (Clock::now() < wait_until) {
      serve();
      std::this_thread::sleep_for(kTick);
    }
    preface = "  (world rank " + std::to_string(reporter) + " was to report this and has not ended the job)\n";
  }

  std::string body, arrived;
  for (int m : group_members) {
    if (m == rank) continue;
    const RankStatus& s = got[std::size_t(m)];
    if (!have[std::size_t(m)]) {
      body += "  world rank " + std::to_string(m) + " on host " + host_of(m) +
              " did not arrive: its watchdog did not answer within " + fixed1(grace) +
              " s: the process has died or is stopped\n";
    } else if (State(s.state) != State::computing && s.number == mine.number && std::strcmp(s.op, mine.op) == 0 &&
               std::strcmp(s.group, mine.group) == 0 && std::strcmp(s.members, mine.members) == 0) {
      arrived += (arrived.empty() ? "" : ", ") + std::to_string(m);
    } else {
      body += "  " + what_instead(s, *this) + "\n";
    }
  }
  if (body.empty())
    body = "  every member is inside this call: the transfer itself is not progressing (a network or device "
           "fault)\n";
  if (!arrived.empty()) body += "  waiting in the same call: world ranks " + arrived + " and this one\n";
  std::string silent;
  for (int q = 0; q < size; ++q)
    if (!have[std::size_t(q)] && std::find(group_members.begin(), group_members.end(), q) == group_members.end())
      silent += (silent.empty() ? "" : ", ") + std::to_string(q) + " (" + host_of(q) + ")";
  if (!silent.empty()) body += "  no answer either from world ranks " + silent + "\n";
  end_job(header + preface + body + "  ending every rank (exit code 1)\n");
}

void Watchdog::loop() {
  while (!stopping.load()) {
    if (census_possible) serve();
    RankStatus mine;
    std::vector<int> group_members;
    if (overdue(mine, group_members)) census_and_end(mine, group_members);
    std::this_thread::sleep_for(kTick);
  }
}

}  // namespace

std::string members_text(const std::vector<int>& world_ranks) {
  constexpr std::size_t kListed = 16;
  std::string text;
  for (std::size_t i = 0; i < world_ranks.size() && i < kListed; ++i)
    text += (i ? "," : "") + std::to_string(world_ranks[i]);
  if (world_ranks.size() > kListed) text += ",... (" + std::to_string(world_ranks.size()) + " ranks)";
  return text;
}

void start(const WatchdogOptions& options) {
  Watchdog& w = wd();
  if (w.running.load()) throw RunError("watchdog: started twice");
  if (!(options.timeout_s >= 0))
    throw InputError("--timeout: expected seconds >= 0 (0: no watchdog), got " + fixed1(options.timeout_s));
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  if (options.fault.active() && options.fault.rank >= w.size)
    throw InputError("--inject-fault " + to_string(options.fault) + ": world rank " +
                     std::to_string(options.fault.rank) + " does not exist (the job has " + std::to_string(w.size) +
                     " ranks)");
  w.fault = options.fault;
  w.timeout = options.timeout_s;
  if (options.timeout_s == 0) return;
  // Long enough for every live rank's watchdog to answer, short beside the timeout itself.
  w.grace = std::clamp(0.2 * options.timeout_s, 1.0, 10.0);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  w.census_possible = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(std::size_t(w.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w.comm);
  w.hosts.clear();
  for (int r = 0; r < w.size; ++r) w.hosts.emplace_back(&all[std::size_t(r) * MPI_MAX_PROCESSOR_NAME]);
  if (w.census_possible)
    MPI_Irecv(&w.incoming_buf, 1, MPI_INT, MPI_ANY_SOURCE, kTagRequest, w.comm, &w.incoming);
  w.stopping = false;
  w.thread = std::thread([&w] { w.loop(); });
  w.running = true;
}

void stop() {
  Watchdog& w = wd();
  if (!w.running.load()) return;
  w.stopping = true;
  w.thread.join();
  w.running = false;
  if (w.incoming != MPI_REQUEST_NULL) {
    MPI_Cancel(&w.incoming);
    MPI_Wait(&w.incoming, MPI_STATUS_IGNORE);
  }
  for (auto& [status, request] : w.replies) MPI_Request_free(&request);
  w.replies.clear();
  MPI_Comm_free(&w.comm);
}

bool running() { return wd().running.load(); }
double timeout_s() { return wd().timeout; }

void at_step(long n) {
  Watchdog& w = wd();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.step = n;
  }
  const FaultInjection& f = w.fault;
  if (!f.active() || f.rank != w.rank || f.step != n) return;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const bool hang = f.kind == FaultInjection::Kind::hang;
  std::fprintf(stderr, "\ntedsim: --inject-fault %s: world rank %d on host %s %s at step %ld (a testing aid)\n",
               to_string(f).c_str(), w.rank, host, hang ? "hangs, outside any collective," : "exits now, as a crash would,", n);
  std::fflush(stderr);
  if (!hang) std::_Exit(int(ExitCode::failure));
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

WatchedCall::WatchedCall(const CallSite& site) {
  Watchdog& w = wd();
  if (!w.running.load(std::memory_order_relaxed) || w.depth++ > 0) return;
  outer_ = true;
  std::lock_guard<std::mutex> lock(w.mu);
  w.in_call = true;
  w.timed_out = false;
  w.op = site.op;
  w.group = site.group;
  w.members = site.members;
  w.group_rank = site.group_rank;
  w.group_size = site.group_size;
  w.number = site.number;
  w.since = Clock::now();
}

WatchedCall::~WatchedCall() {
  Watchdog& w = wd();
  if (!outer_) {
    if (w.depth > 0) --w.depth;
    return;
  }
  w.depth = 0;
  std::lock_guard<std::mutex> lock(w.mu);
  w.in_call = false;
  w.last_op = w.op;
  w.last_group = *w.group;
  w.last_number = w.number;
  w.last_end = Clock::now();
}

int add_abort_hook(std::function<void()> hook) {
  Watchdog& w = wd();
  std::lock_guard<std::mutex> lock(w.hooks_mu);
  const int id = w.next_hook++;
  w.hooks[id] = std::move(hook);
  return id;
}

void remove_abort_hook(int id) {
  Watchdog& w = wd();
  std::lock_guard<std::mutex> lock(w.hooks_mu);
  w.hooks.erase(id);
}

}  // namespace tedsim::watchdog
