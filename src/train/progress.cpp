#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace fsdp {

ProgressBar::ProgressBar(bool enabled, std::string label, int64_t total)
    : enabled_(enabled && total > 0),
      label_(std::move(label)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (drawn_) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, std::round(seconds)));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
  const double elapsed_s = std::chrono::duration<double>(now - start_).count();
  const double left_s = done > 0 ? elapsed_s * (1.0 - frac) / frac : 0.0;
  // Ten cells, eighths of a cell in the partial one (tqdm's bar).
  static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const int width = 10, eighths = static_cast<int>(frac * width * 8);
  std::string bar;
  for (int i = 0; i < eighths / 8; ++i) bar += "█";
  int cells = eighths / 8;
  if (cells < width && eighths % 8 != 0) {
    bar += kEighths[eighths % 8];
    ++cells;
  }
  bar.append(static_cast<size_t>(width - cells), ' ');
  std::printf("\r%s %3d%%|%s| %lld/%lld [%s<%s]%s%s\033[K", label_.c_str(), static_cast<int>(frac * 100), bar.c_str(),
              static_cast<long long>(done), static_cast<long long>(total_), format_duration(elapsed_s).c_str(),
              format_duration(left_s).c_str(), extra.empty() ? "" : " ", extra.c_str());
  std::fflush(stdout);
}

// mpirun hands its ranks a pseudo-terminal even when its own output goes to a file (a Slurm log),
// so under a launcher the rank's isatty says nothing: what counts is where the launcher's own
// output goes, its stdout as /proc shows it (mpirun, or the orted/prted daemon on this node, is
// the rank's parent). A terminal there: bars; a file or a pipe: plain lines. Remote ranks'
// daemons have no terminal, and srun's slurmstepd writes to the job's log.
bool interactive_terminal() {
  if (!isatty(fileno(stdout))) return false;
  bool launched = false;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    launched = launched || std::getenv(var) != nullptr;
  if (!launched) return true;
  char target[256] = {};
  const std::string fd = "/proc/" + std::to_string(getppid()) + "/fd/1";
  const ssize_t n = readlink(fd.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  const std::string out(target, static_cast<size_t>(n));
  return out.starts_with("/dev/pts/") || out.starts_with("/dev/tty");
}

}  // namespace fsdp
