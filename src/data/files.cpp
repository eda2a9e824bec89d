#include "data/files.h"

#include <algorithm>

#include "data/data.h"
#include "tensor/error.h"

namespace fsdp {

namespace fs = std::filesystem;

std::vector<fs::path> corpus_files(const std::string& path, const std::string& what) {
  auto fail = [&](const std::string& problem) { return Error(what + " " + path + ": " + problem); };
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    std::string hint = path == kTextCorpusDir ? " (install the Debian package fortunes)" : "";
    throw fail("not found" + hint);
  }
  if (fs::is_regular_file(status)) return {fs::path(path)};
  if (!fs::is_directory(status)) throw fail("is neither a regular file nor a folder");

  std::vector<fs::path> files;
  fs::recursive_directory_iterator it(path, error), end;
  for (; !error && it != end; it.increment(error)) {
    if (it->is_symlink() || !it->is_regular_file()) continue;
    files.push_back(it->path());
  }
  if (error) throw fail("cannot list: " + error.message());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace fsdp
