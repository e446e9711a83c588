#pragma once
// MPI for the duration of a command: commands that need ranks (calibrate, validate) initialise MPI
// themselves, so the planning commands run without mpirun. Initialises only if nobody has, and
// finalises only what it initialised.
namespace tedsim {

class MpiSession {
 public:
  MpiSession();  // throws RunError if MPI cannot start
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owner_ = false;
};

}  // namespace tedsim
