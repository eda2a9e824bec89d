#pragma once
// A tqdm-like bar on rank 0's terminal, redrawn in place:
//   train  37%|███▋      | 120/322 [00:45<01:15] loss 2.3142
// Off (draws nothing) when the output is not a terminal: Slurm logs and pipes get the plain
// lines the trainer prints instead.
#include <chrono>
#include <cstdint>
#include <string>

namespace fsdp {

class ProgressBar {
 public:
  ProgressBar(bool enabled, std::string label, int64_t total);
  ~ProgressBar();  // ends the line if anything was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  // done of total; `extra` follows the timing (a loss, a rate). Redraws at most 10 times a second
  // and always at the end.
  void update(int64_t done, const std::string& extra = "");
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::string label_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

// Whether progress may redraw one line: rank 0 on a terminal, and not under a launcher.
bool interactive_terminal();

// "01:15", or "1:02:03" past an hour.
std::string format_duration(double seconds);

}  // namespace fsdp
