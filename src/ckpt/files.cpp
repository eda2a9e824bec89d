// Checkpoint files in checkpoint.dir: names, the newest complete one, pruning to the last K.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "ckpt/internal.h"
#include "tensor/error.h"

namespace fsdp {

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

// ckpt_<step>.h5, newest first.
std::vector<std::pair<int64_t, std::string>> step_files(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> files;
  static const std::regex name(R"(ckpt_([0-9]{1,18})\.h5)");
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    std::string file = it->path().filename().string();
    if (std::regex_match(file, m, name)) files.emplace_back(std::stoll(m[1]), it->path().string());
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return files;
}

}  // namespace

CheckpointFormat parse_checkpoint_format(const std::string& name) {
  if (const auto f = parse_name(kCheckpointFormats, name)) return *f;
  throw Error("checkpoint.format '" + name + "': expected " + names_of(kCheckpointFormats));
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt_%08lld.h5", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::string best_checkpoint_path(const std::string& dir) { return (fs::path(dir) / "best.h5").string(); }

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  H5Quiet quiet;
  const std::string what = "checkpoint " + path;
  H5Id file = open_checkpoint_file(path, what);
  return read_meta(file.get(), what);
}

std::vector<std::string> complete_checkpoints(const std::string& dir, std::vector<std::string>* skipped,
                                              size_t max_count) {
  std::vector<std::string> out;
  for (const auto& [step, path] : step_files(dir)) {
    if (out.size() >= max_count) break;
    try {
      CheckpointMeta m = read_checkpoint_meta(path);
      if (m.step != step) throw Error("checkpoint " + path + ": its step attribute says " + std::to_string(m.step));
      out.push_back(path);
    } catch (const Error& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return out;
}

std::string latest_checkpoint(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<std::string> newest = complete_checkpoints(dir, skipped, 1);
  return newest.empty() ? "" : newest.front();
}

void prune_checkpoints(const std::string& dir, int64_t keep, int64_t saved_step) {
  std::vector<std::pair<int64_t, std::string>> files = step_files(dir);
  std::erase_if(files, [&](const auto& f) { return f.first > saved_step; });
  std::error_code ec;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 0)); i < files.size(); ++i)
    fs::remove(files[i].second, ec);
  // A .tmp left by a save that was killed is never complete: nothing can resume from it.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".tmp" &&
        (it->path().filename().string().rfind("ckpt_", 0) == 0 || it->path().filename() == "best.h5.tmp"))
      fs::remove(it->path(), ec);
}

}  // namespace fsdp
