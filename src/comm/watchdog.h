#pragma once
// A deadline for calls that cannot be polled. Some collectives are faster as one blocking MPI
// call (OpenMPI's MPI_Allgather beats its MPI_Iallgather several times over here), but a
// blocking call cannot honour comm.timeout_s by itself: a hung peer (stopped, swapping, stuck in
// I/O) would hold every other rank forever. While armed, the watchdog's thread waits for the
// deadline; if the call has not returned by then it prints what hung and ends this process with
// exit code 1, which makes mpirun or srun end the job. Arming and disarming cost one mutex and
// one notify, nothing next to a 64 KiB+ collective.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace fsdp {

class Watchdog {
 public:
  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Disarms when it goes out of scope (the call returned, or threw).
  class Armed {
   public:
    explicit Armed(Watchdog& w) : w_(w) {}
    ~Armed() { w_.disarm(); }
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    Watchdog& w_;
  };
  // `what` names the call in the message, e.g. "all_gather #12 of 1048576 f32 (mpi)".
  [[nodiscard]] Armed arm(std::string what, double timeout_s);

 private:
  void disarm();
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stop_ = false;
  uint64_t generation_ = 0;  // which arming a wake-up belongs to
  std::string what_;
  double timeout_s_ = 0.0;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace fsdp
