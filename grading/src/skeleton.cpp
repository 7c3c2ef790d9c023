// The skeleton manifest: which labs a student has not started (skeleton.hpp).
#include "skeleton.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tools.hpp"

namespace dtl::grade {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> student_paths(const Rubric& r) {
  std::vector<std::string> paths;
  for (auto& f : r.student_files) paths.push_back("labs/" + r.slug + "/" + f);
  return paths;
}

}  // namespace

std::map<std::string, std::string> sha256_of(const std::string& source,
                                             const std::vector<std::string>& files) {
  std::map<std::string, std::string> out;
  // An argument vector, never a shell: the paths are a submission's file names.
  std::vector<std::string> argv = {"sha256sum", "--"};
  std::map<std::string, std::string> relative;  // the path sha256sum prints -> the file's name
  for (auto& f : files) {
    const std::string path = (fs::path(source) / f).string();
    if (!fs::exists(path)) continue;
    argv.push_back(path);
    relative[path] = f;
  }
  if (relative.empty()) return out;
  std::string text;
  try {
    text = run_tool(argv);
  } catch (const std::exception&) {
    return out;
  }
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // "HASH  path" (a leading backslash marks an escaped name: not ours, skip it).
    if (line.size() < 67 || line[0] == '\\') continue;
    auto it = relative.find(line.substr(66));
    if (it != relative.end()) out[it->second] = line.substr(0, 64);
  }
  return out;
}

std::map<std::string, std::string> read_skeleton_manifest(const std::string& source) {
  std::map<std::string, std::string> out;
  std::ifstream in(fs::path(source) / kSkeletonManifest);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.size() < 67) continue;
    out[line.substr(66)] = line.substr(0, 64);
  }
  return out;
}

bool untouched_skeleton(const Rubric& r, const std::string& source) {
  const auto manifest = read_skeleton_manifest(source);
  const auto paths = student_paths(r);
  if (paths.empty()) return false;
  for (auto& p : paths)
    if (!manifest.count(p)) return false;
  const auto now = sha256_of(source, paths);
  for (auto& p : paths) {
    auto it = now.find(p);
    if (it == now.end() || it->second != manifest.at(p)) return false;
  }
  return true;
}

int stamp_skeletons(const std::string& source) {
  std::vector<std::string> paths;
  for (auto& r : load_rubrics(source, {}))
    for (auto& p : student_paths(r)) paths.push_back(p);
  const auto hashes = sha256_of(source, paths);
  std::ofstream out(fs::path(source) / kSkeletonManifest);
  out << "# The untouched skeleton of every lab's student files (written by ./lab "
         "stamp-skeletons).\n"
         "# ./lab grade reports a lab whose files match as \"not started\", without building it.\n";
  for (auto& [path, hash] : hashes) out << hash << "  " << path << "\n";
  return static_cast<int>(hashes.size());
}

std::vector<std::string> stale_skeletons(const std::string& source) {
  std::vector<std::string> problems;
  const auto manifest = read_skeleton_manifest(source);
  std::vector<std::string> paths;
  for (auto& r : load_rubrics(source, {}))
    for (auto& p : student_paths(r)) paths.push_back(p);
  const auto now = sha256_of(source, paths);
  for (auto& p : paths) {
    auto want = manifest.find(p);
    auto have = now.find(p);
    if (have == now.end()) continue;  // a lab this tree does not hold (a student release)
    if (want == manifest.end())
      problems.push_back(fmt::format("{}: not in {}", p, kSkeletonManifest));
    else if (want->second != have->second)
      problems.push_back(fmt::format("{}: changed since {} was written", p, kSkeletonManifest));
  }
  return problems;
}

}  // namespace dtl::grade
