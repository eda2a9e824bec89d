#pragma once
// The files a corpus path names: the file itself, or every regular file under a folder,
// recursively, sorted by path. Symlinks are skipped so a file is never read twice (Debian's
// fortunes has foo.u8 -> foo); the readers skip binary files themselves (a NUL byte).
#include <filesystem>
#include <string>
#include <vector>

namespace fsdp {

// `what` starts the messages ("text corpus", "causal_lm data"): "WHAT PATH: not found" and the
// like, as an Error. The Debian fortunes folder's absence names its package.
std::vector<std::filesystem::path> corpus_files(const std::string& path, const std::string& what);

}  // namespace fsdp
