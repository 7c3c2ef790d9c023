// skeleton.hpp — defines: SkeletonManifest, untouched_skeleton, stamp_skeletons, stale_skeletons.
//
// A lab whose student files are still the course's skeleton, byte for byte, has nothing to grade:
// CI's skeleton check proves that such files fail every public test with "not implemented", so
// `./lab grade` reports the lab "not started" without building or running it (a fresh clone
// grades in a minute instead of an hour). The skeletons' SHA-256 sums live in
// grading/skeletons.sha256 (sha256sum's format: "HASH  labs/NN_slug/file"), written by
// `./lab stamp-skeletons` and checked against the tree in CI (grading.skeleton-hashes).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rubric.hpp"

namespace dtl::grade {

// Where the manifest lives under the repository root.
inline constexpr const char* kSkeletonManifest = "grading/skeletons.sha256";

// SHA-256 of each file (paths relative to `source`), by `sha256sum`; a missing file has none.
std::map<std::string, std::string> sha256_of(const std::string& source,
                                             const std::vector<std::string>& files);

// The manifest's entries: relative path -> hash (empty when there is no manifest).
std::map<std::string, std::string> read_skeleton_manifest(const std::string& source);

// True when every student file of `r` exists and equals its skeleton hash. A file without an
// entry counts as started: grading it fully is never wrong, only slower.
bool untouched_skeleton(const Rubric& r, const std::string& source);

// Writes the manifest for every rubric's student files; returns how many files it lists.
int stamp_skeletons(const std::string& source);

// Lines describing every student file whose hash differs from the manifest (empty: current).
std::vector<std::string> stale_skeletons(const std::string& source);

}  // namespace dtl::grade
