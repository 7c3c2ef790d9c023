// Lab 17 reference solution: sharded checkpoints in the safetensors layout, an atomic commit,
// loading with resharding, exact resume, and an asynchronous save.
#include "checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dtl/error.hpp"

namespace dtl::lab17 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------- POSIX helpers
// Durability needs file descriptors: fsync(fd) pushes a file's data to the disk, and fsync of
// the *directory* makes a new name in it (a created file, a rename) survive a power cut.

std::string os_error(const std::string& what, const std::string& path) {
  return fmt::format("{} {}: {}", what, path, std::strerror(errno));
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DTL_CHECK(w > 0, os_error("cannot write", path));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  DTL_CHECK(fd >= 0, os_error("cannot open directory", dir));
  ::fsync(fd);
  ::close(fd);
}

// A small file written whole and synced (the manifest, the latest pointer's new version).
void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DTL_CHECK(fd >= 0, os_error("cannot create", path));
  write_all(fd, text.data(), text.size(), path);
  const int rc = ::fsync(fd);
  ::close(fd);
  DTL_CHECK(rc == 0, os_error("cannot sync", path));
}

std::string read_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string shard_name(int rank, int world) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world);
}

// Every rank's error (or ""), on every rank: the first one raised everywhere, so a failure on
// one rank never leaves the others waiting in a collective.
void raise_if_any(Comm& comm, const std::string& mine) {
  for (const auto& e : all_gather_strings(comm, mine))
    if (!e.empty()) throw Error(e);
}

}  // namespace

// ---------------------------------------------------------------- Task 1: shard files

FileInfo write_shard(const std::string& path, const std::vector<ShardEntry>& entries,
                     const std::map<std::string, std::string>& metadata) {
  // Host copies, contiguous: what goes to the disk are their bytes (little-endian on x86 and
  // ARM, which is what safetensors specifies).
  std::vector<torch::Tensor> host;
  json header = json::object();
  int64_t offset = 0;
  for (const auto& e : entries) {
    torch::Tensor t = e.data.detach().to(torch::kCPU).contiguous();
    const int64_t nbytes = static_cast<int64_t>(t.nbytes());
    header[e.name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                      {"shape", t.sizes().vec()},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    host.push_back(t);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DTL_CHECK(fd >= 0, os_error("write_shard: cannot create", path));
  uint32_t crc = 0;
  auto put = [&](const void* p, size_t n) {
    write_all(fd, p, n, path);
    crc = crc32(p, n, crc);
  };
  put(len, 8);
  put(text.data(), text.size());
  for (const auto& t : host) put(t.data_ptr(), t.nbytes());
  const int rc = ::fsync(fd);
  ::close(fd);
  DTL_CHECK(rc == 0, os_error("write_shard: cannot sync", path));
  return {fs::path(path).filename().string(), static_cast<int64_t>(8 + text.size()) + offset, crc};
}

void read_bytes(const std::string& path, int64_t offset, const torch::Tensor& dst) {
  DTL_CHECK(dst.device().is_cpu() && dst.is_contiguous(),
            "read_bytes: dst must be a contiguous CPU tensor");
  const int fd = ::open(path.c_str(), O_RDONLY);
  DTL_CHECK(fd >= 0, os_error("read_bytes: missing file", path));
  char* p = static_cast<char*>(dst.data_ptr());
  size_t left = dst.nbytes();
  off_t at = static_cast<off_t>(offset);
  while (left > 0) {  // pread: exactly these bytes, no seek, safe from any thread
    const ssize_t r = ::pread(fd, p, left, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      throw Error(fmt::format("read_bytes: {} is truncated: {} bytes at offset {} are past its end",
                              path, left, at));
    }
    p += r;
    at += r;
    left -= static_cast<size_t>(r);
  }
  ::close(fd);
}

ShardHeader read_shard_header(const std::string& path) {
  const int64_t size = file_size(path);
  DTL_CHECK(size >= 0, fmt::format("read_shard_header: missing file {}", path));
  DTL_CHECK(size >= 8, fmt::format("read_shard_header: {} is truncated: {} bytes, no header length", path, size));
  torch::Tensor len = torch::empty({8}, torch::kUInt8);
  read_bytes(path, 0, len);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i].item<uint8_t>()) << (8 * i);
  DTL_CHECK(static_cast<int64_t>(n) <= size - 8,
            fmt::format("read_shard_header: {} is truncated: its header says {} bytes, the file has {}",
                        path, n, size - 8));
  torch::Tensor text = torch::empty({static_cast<int64_t>(n)}, torch::kUInt8);
  read_bytes(path, 8, text);
  const std::string header(static_cast<const char*>(text.data_ptr()), n);
  // A NUL is no JSON whitespace: the real reader (serde_json) and Python's json refuse it, while
  // a parser reading C strings would stop there and accept the file. JSON's own whitespace
  // around the object is fine: the real reader skips it, before the object as after.
  const size_t open = header.find_first_not_of(" \t\n\r");
  DTL_CHECK(header.find('\0') == std::string::npos && open != std::string::npos && header[open] == '{',
            fmt::format("read_shard_header: {}: the header is not a JSON object padded with spaces", path));
  json j = json::parse(header, nullptr, false);
  DTL_CHECK(j.is_object(), fmt::format("read_shard_header: {}: the header is not valid JSON", path));
  ShardHeader h;
  h.data_start = 8 + static_cast<int64_t>(n);
  std::vector<std::pair<int64_t, int64_t>> ranges;  // what the real reader validates
  try {
    for (auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        h.metadata = v.get<std::map<std::string, std::string>>();
        continue;
      }
      HeaderEntry e;
      e.dtype = v.at("dtype").get<std::string>();
      // The real reader's types are Vec<usize> and (usize, usize): JSON integers, not negative,
      // and exactly two offsets. nlohmann's get<int64_t> would take 2.0 as 2 and a third offset
      // would go unread, so both are checked here.
      const json& shape = v.at("shape");
      const json& offsets = v.at("data_offsets");
      DTL_CHECK(shape.is_array() && std::all_of(shape.begin(), shape.end(),
                                                [](const json& d) { return d.is_number_unsigned(); }),
                fmt::format("read_shard_header: {}: invalid header: tensor '{}' has the shape {}, not "
                            "a list of non-negative integers", path, name, shape.dump()));
      DTL_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                fmt::format("read_shard_header: {}: invalid header: tensor '{}' has the data_offsets "
                            "{}, not two non-negative integers", path, name, offsets.dump()));
      e.shape = shape.get<std::vector<int64_t>>();
      e.begin = offsets[0].get<int64_t>();
      e.end = offsets[1].get<int64_t>();
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      int64_t esize = 0;
      try {
        esize = static_cast<int64_t>(c10::elementSize(dtype_from_safetensors(e.dtype)));
      } catch (const Error&) {
        throw Error(fmt::format("read_shard_header: {}: invalid header: tensor '{}' has an "
                                "unknown dtype '{}'", path, name, e.dtype));
      }
      DTL_CHECK(e.begin >= 0 && e.begin <= e.end && e.end - e.begin == numel * esize,
                fmt::format("read_shard_header: {}: invalid header: tensor '{}' ({} {}) has the "
                            "byte range [{}, {}), not {} bytes", path, name, e.dtype,
                            json(e.shape).dump(), e.begin, e.end, numel * esize));
      ranges.emplace_back(e.begin, e.end);
      h.tensors[name] = e;
    }
  } catch (const json::exception& ex) {
    throw Error(fmt::format("read_shard_header: {}: invalid header: {}", path, ex.what()));
  }
  // The ranges, in order, tile the data section exactly: no hole, no overlap, nothing after.
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    DTL_CHECK(b == at, fmt::format("read_shard_header: {}: invalid header: the data has {} at "
                                   "byte {} (the ranges must tile it)", path,
                                   b > at ? "a hole" : "an overlap", std::min(b, at)));
    at = e;
  }
  DTL_CHECK(h.data_start + at == size,
            fmt::format("read_shard_header: {}: invalid header: the tensors end at byte {} of the "
                        "file, which has {} bytes ({})", path, h.data_start + at, size,
                        h.data_start + at > size ? "truncated" : "trailing bytes"));
  return h;
}

// ---------------------------------------------------------------- pieces: flat ranges and boxes

namespace {

// A piece of a tensor, as a ShardedTensor or a manifest chunk describes it: a flat range
// [offset, offset + numel) of the row-major flattened tensor, or a box (box_offset, box_shape).
struct Piece {
  std::vector<int64_t> box_offset, box_shape;  // empty: the flat range
  int64_t offset = 0, numel = 0;
  bool flat() const { return box_offset.empty(); }
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Piece piece_of(const ShardedTensor& t) {
  Piece p{t.box_offset, {}, t.offset, t.local.numel()};
  if (!p.flat()) p.box_shape = t.local.sizes().vec();
  return p;
}

// A piece lies inside the tensor, and a box names every dimension: checked before anything is
// written or read, so that a wrong box is an error and not someone else's elements.
void check_piece(const Piece& p, const std::vector<int64_t>& shape, const std::string& what) {
  if (p.flat()) {
    DTL_CHECK(p.offset >= 0 && p.offset + p.numel <= numel_of(shape),
              fmt::format("{}: the range [{}, {}) is outside the tensor's {} elements", what,
                          p.offset, p.offset + p.numel, numel_of(shape)));
    return;
  }
  DTL_CHECK(p.box_offset.size() == shape.size() && p.box_shape.size() == shape.size(),
            fmt::format("{}: a box of offset {} and shape {} in a tensor of {} dimensions (one "
                        "entry per dimension)", what, json(p.box_offset).dump(),
                        json(p.box_shape).dump(), shape.size()));
  for (size_t d = 0; d < shape.size(); ++d)
    DTL_CHECK(p.box_offset[d] >= 0 && p.box_shape[d] >= 0 &&
                  p.box_offset[d] + p.box_shape[d] <= shape[d],
              fmt::format("{}: the box of offset {} and shape {} does not fit inside the shape {}",
                          what, json(p.box_offset).dump(), json(p.box_shape).dump(),
                          json(shape).dump()));
}

// A box of the tensor whose elements a piece stores row-major, back to back, from element
// `base` of its buffer.
struct Part {
  std::vector<int64_t> lo, size;  // [lo[d], lo[d] + size[d]) in each dimension d
  int64_t base = 0;
};

// A flat range [begin, end) of a row-major tensor is a union of at most 2N-1 boxes, each
// contiguous in memory: the rest of a row, whole rows, the rest of a plane, whole planes, ...
// then back down. Each step takes the outermost dimension d whose blocks (stride[d] elements)
// start at `at` and fit before `end`, and as many of them as fit.
std::vector<Part> flat_parts(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const size_t n = shape.size();
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<Part> parts;
  for (int64_t at = begin; at < end;) {
    size_t d = 0;
    while (at % stride[d] != 0 || end - at < stride[d]) ++d;  // stride[n - 1] == 1 stops it
    Part p;
    p.base = at - begin;
    for (size_t i = 0; i < n; ++i) {
      p.lo.push_back(at / stride[i] % shape[i]);
      p.size.push_back(i < d ? 1 : shape[i]);
    }
    p.size[d] = std::min((end - at) / stride[d], shape[d] - p.lo[d]);
    parts.push_back(p);
    at += p.size[d] * stride[d];
  }
  return parts;
}

// A piece's parts in `view` (the tensor's shape; {numel} when only flat pieces meet).
std::vector<Part> parts_of(const Piece& p, const std::vector<int64_t>& view) {
  if (p.flat()) return flat_parts(view, p.offset, p.offset + p.numel);
  return {Part{p.box_offset, p.box_shape, 0}};
}

// The box two parts share (size 0 in some dimension when none).
Part intersect(const Part& a, const Part& b) {
  Part o;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    o.lo.push_back(std::max(a.lo[d], b.lo[d]));
    const int64_t hi = std::min(a.lo[d] + a.size[d], b.lo[d] + b.size[d]);
    o.size.push_back(std::max<int64_t>(0, hi - o.lo[d]));
  }
  return o;
}

// Reads the box `o` (inside both parts) from the saved part, whose piece starts at byte `at` of
// `path`, into the wanted part of `host` (1-D, contiguous): one read per run. The trailing
// dimensions that `o` spans whole in both parts are contiguous in the file and in host alike,
// so they join the last partial one (a whole tensor is one run, a column block one per row).
void read_box(const std::string& path, int64_t at, const Part& saved, const Part& want,
              const Part& o, const torch::Tensor& host) {
  const size_t n = o.lo.size();
  size_t k = n - 1;
  while (k > 0 && o.size[k] == saved.size[k] && o.size[k] == want.size[k]) --k;
  int64_t run = 1;
  for (size_t d = k; d < n; ++d) run *= o.size[d];
  const int64_t esize = static_cast<int64_t>(host.element_size());
  std::vector<int64_t> idx = o.lo;  // the run's first element, in the tensor's coordinates
  for (;;) {
    int64_t s = 0, w = 0;  // its row-major position in the saved part and in the wanted part
    for (size_t d = 0; d < n; ++d) {
      s = s * saved.size[d] + (idx[d] - saved.lo[d]);
      w = w * want.size[d] + (idx[d] - want.lo[d]);
    }
    read_bytes(path, at + (saved.base + s) * esize, host.narrow(0, want.base + w, run));
    // The next run: count through the dimensions before k like an odometer; done when it wraps.
    size_t d = k;
    for (; d > 0; --d) {
      if (++idx[d - 1] < o.lo[d - 1] + o.size[d - 1]) break;
      idx[d - 1] = o.lo[d - 1];
    }
    if (d == 0) return;
  }
}

}  // namespace

// ---------------------------------------------------------------- Task 2: save

std::string latest(const std::string& root) {
  std::string name = read_text((fs::path(root) / "latest").string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name.empty() ? "" : (fs::path(root) / name).string();
}

std::string save(const std::string& root, const Snapshot& s, Comm& comm, const SaveOptions& options) {
  const int n = comm.size(), rank = comm.rank();
  const std::string name = dir_name(s.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp = fs::path(root) / (".tmp-" + name);

  // 1. The temporary directory: invisible to load(), which only ever follows `latest`.
  std::string error;
  if (rank == 0) {
    try {
      DTL_CHECK(latest(root) != final_dir.string(),
                fmt::format("save: {} is the latest checkpoint; it is never overwritten", final_dir.string()));
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directory(tmp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  raise_if_any(comm, error);

  // Each rank its shard: its slices under their names, its own tensors under "rank/".
  json mine;
  try {
    std::vector<ShardEntry> entries;
    std::map<std::string, std::string> meta = {{"rank", std::to_string(rank)},
                                               {"world_size", std::to_string(n)}};
    for (const auto& t : s.sharded) {
      check_piece(piece_of(t), t.global_shape,
                  fmt::format("save: rank {}: tensor '{}'", rank, t.name));
      // A box goes in with its own shape (write_shard writes local's), so the file describes it.
      entries.push_back({t.name, t.local});
      if (t.box_offset.empty())
        meta["offset/" + t.name] = std::to_string(t.offset);
      else
        meta["box_offset/" + t.name] = json(t.box_offset).dump();
    }
    for (const auto& t : s.per_rank) entries.push_back({"rank/" + t.name, t.value});
    const FileInfo info = write_shard((tmp / shard_name(rank, n)).string(), entries, meta);
    mine = {{"file", info.file}, {"bytes", info.bytes}, {"crc32", info.crc32}, {"chunks", json::array()}};
    for (const auto& t : s.sharded) {
      json c = {{"name", t.name}, {"numel", t.local.numel()},
                {"dtype", safetensors_dtype(t.local.scalar_type())}, {"shape", t.global_shape}};
      if (t.box_offset.empty())
        c["offset"] = t.offset;
      else
        c.update({{"box_offset", t.box_offset}, {"box_shape", t.local.sizes().vec()}});
      mine["chunks"].push_back(c);
    }
  } catch (const std::exception& e) {
    mine = {{"error", e.what()}};
  }
  fault_point("shard", s.step);
  const std::vector<std::string> all = all_gather_strings(comm, mine.dump());

  // 2. Rank 0 commits: manifest, rename, latest, clean-up. Every shard is synced by now (each
  // rank synced before it answered), so the rename publishes only complete data.
  error.clear();
  if (rank == 0) {
    try {
      json manifest = {{"format", "dtl-checkpoint-1"}, {"step", s.step}, {"world_size", n},
                       {"layout", s.layout}, {"counters", s.counters}, {"tensors", json::object()},
                       {"per_rank", json::array()}, {"files", json::object()}};
      for (const auto& t : s.per_rank) manifest["per_rank"].push_back(t.name);
      for (int r = 0; r < n; ++r) {
        const json f = json::parse(all[r]);
        DTL_CHECK(!f.contains("error"), f.value("error", std::string("?")));
        manifest["files"][f["file"].get<std::string>()] = {
            {"rank", r}, {"bytes", f["bytes"]}, {"crc32", f["crc32"]}};
        for (const auto& c : f["chunks"]) {
          json& t = manifest["tensors"][c["name"].get<std::string>()];
          t["shape"] = c["shape"];
          t["dtype"] = c["dtype"];
          if (c["numel"].get<int64_t>() > 0 && c.contains("box_offset"))
            t["chunks"].push_back({{"file", f["file"]}, {"box_offset", c["box_offset"]},
                                   {"box_shape", c["box_shape"]}});
          else if (c["numel"].get<int64_t>() > 0)
            t["chunks"].push_back({{"file", f["file"]}, {"offset", c["offset"]}, {"numel", c["numel"]}});
          else if (!t.contains("chunks"))
            t["chunks"] = json::array();
        }
      }
      write_file_synced((tmp / "manifest.json").string(), manifest.dump(1));
      sync_dir(tmp.string());
      fault_point("commit", s.step);
      fs::remove_all(final_dir);  // an old copy `latest` does not name (checked above)
      fs::rename(tmp, final_dir);
      sync_dir(root);
      const fs::path pointer = fs::path(root) / "latest", next = fs::path(root) / ".latest.tmp";
      write_file_synced(next.string(), name + "\n");
      fs::rename(next, pointer);  // atomic: a reader sees the old name or the new one
      sync_dir(root);
      // Keep the newest keep_last; never the one `latest` names (it is the newest).
      std::vector<std::string> steps;
      for (const auto& entry : fs::directory_iterator(root)) {
        const std::string d = entry.path().filename().string();
        if (d.rfind("step-", 0) == 0) steps.push_back(d);
        if (d.rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
      }
      std::sort(steps.begin(), steps.end());
      const size_t keep = static_cast<size_t>(std::max(1, options.keep_last));
      for (size_t i = 0; i + keep < steps.size(); ++i)
        if (steps[i] != name) fs::remove_all(fs::path(root) / steps[i]);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // 3. Everyone returns after the commit (or raises rank 0's error).
  raise_if_any(comm, error);
  return final_dir.string();
}

// ---------------------------------------------------------------- Task 3: load

namespace {

// load() without the guard: every manifest key is read with at() (a missing one throws
// json::exception, which load() turns into a dtl::Error naming the manifest).
LoadResult load_unchecked(const std::string& root, Snapshot& into, Comm& comm,
                          const LoadOptions& options) {
  const int m = comm.size(), rank = comm.rank();
  LoadResult result;
  result.directory = options.checkpoint.empty() ? latest(root) : options.checkpoint;
  DTL_CHECK(!result.directory.empty() && fs::is_directory(result.directory),
            fmt::format("load: no checkpoint in {} ({}latest names none that exists)", root,
                        root.empty() ? "" : root + "/"));
  const fs::path dir = result.directory;
  const std::string manifest_path = (dir / "manifest.json").string();
  const json manifest = json::parse(read_text(manifest_path), nullptr, false);
  DTL_CHECK(manifest.is_object() && manifest.value("format", "") == "dtl-checkpoint-1",
            fmt::format("load: {} is missing or not a dtl checkpoint manifest", manifest_path));

  // The checks every rank makes alike (same files, same answer): no collective needed yet.
  result.step = manifest.value("step", int64_t{0});
  result.saved_world_size = manifest.value("world_size", 0);
  result.resharded = result.saved_world_size != m;
  DTL_CHECK(!result.resharded || options.allow_reshard,
            fmt::format("load: {}: world size {} in the checkpoint, {} in this job (load with "
                        "allow_reshard to reshard it)", manifest_path, result.saved_world_size, m));
  const json& tensors = manifest.at("tensors");
  DTL_CHECK(tensors.size() == into.sharded.size(),
            fmt::format("load: {} holds {} tensors, the model {}: a checkpoint of another model",
                        manifest_path, tensors.size(), into.sharded.size()));
  for (const auto& t : into.sharded) {
    DTL_CHECK(tensors.contains(t.name),
              fmt::format("load: {} has no tensor '{}': a checkpoint of another model", manifest_path, t.name));
    const json& e = tensors.at(t.name);
    DTL_CHECK(e.at("shape").get<std::vector<int64_t>>() == t.global_shape &&
                  e.at("dtype").get<std::string>() == safetensors_dtype(t.local.scalar_type()),
              fmt::format("load: {}: tensor '{}' is {} {} in the checkpoint but {} {} in the model",
                          manifest_path, t.name, e.at("dtype").get<std::string>(), e.at("shape").dump(),
                          safetensors_dtype(t.local.scalar_type()), json(t.global_shape).dump()));
  }
  std::vector<std::string> files;
  for (auto& [file, info] : manifest.at("files").items()) {
    const std::string path = (dir / file).string();
    const int64_t size = file_size(path);
    DTL_CHECK(size >= 0, fmt::format("load: {} is missing (listed in {})", path, manifest_path));
    DTL_CHECK(size == info.at("bytes").get<int64_t>(),
              fmt::format("load: {} is truncated or overwritten: {} bytes, the manifest says {}",
                          path, size, info.at("bytes").get<int64_t>()));
    files.push_back(file);
  }

  // Checksums: each file read whole once, by rank (its index mod m). This rank's own pieces are
  // checked here too: only it knows them, so its verdict travels with the others'.
  std::string error;
  try {
    for (const auto& t : into.sharded)
      check_piece(piece_of(t), t.global_shape,
                  fmt::format("load: rank {}: tensor '{}'", rank, t.name));
    for (size_t i = static_cast<size_t>(rank); options.verify_checksums && i < files.size();
         i += static_cast<size_t>(m)) {
      const std::string path = (dir / files[i]).string();
      torch::Tensor buf = torch::empty({1 << 20}, torch::kUInt8);
      const int64_t size = file_size(path);
      uint32_t crc = 0;
      for (int64_t at = 0; at < size; at += buf.numel()) {
        torch::Tensor part = buf.narrow(0, 0, std::min<int64_t>(buf.numel(), size - at));
        read_bytes(path, at, part);
        crc = crc32(part.data_ptr(), part.nbytes(), crc);
      }
      const auto want = manifest.at("files").at(files[i]).at("crc32").get<uint32_t>();
      DTL_CHECK(crc == want, fmt::format("load: {} fails its checksum: CRC-32 {} but the "
                                         "manifest says {} (the file is corrupted)", path, crc, want));
    }
  } catch (const json::exception& e) {
    error = fmt::format("load: {}: the manifest lacks a key or holds a wrong value: {}",
                        manifest_path, e.what());
  } catch (const std::exception& e) {
    error = e.what();
  }
  raise_if_any(comm, error);

  // The data: for each wanted piece, the part of each saved chunk it overlaps, and only that.
  std::map<std::string, ShardHeader> headers;  // each file's header, read once
  auto header_of = [&](const std::string& file) -> const ShardHeader& {
    auto it = headers.find(file);
    if (it == headers.end()) it = headers.emplace(file, read_shard_header((dir / file).string())).first;
    return it->second;
  };
  try {
    for (auto& t : into.sharded) {
      const Piece want = piece_of(t);
      const int64_t esize = static_cast<int64_t>(t.local.element_size());
      torch::Tensor host = torch::empty({want.numel}, t.local.options().device(torch::kCPU));
      int64_t covered = 0;
      for (const auto& c : tensors.at(t.name).at("chunks")) {
        Piece saved;
        if (c.contains("box_offset")) {
          saved.box_offset = c.at("box_offset").get<std::vector<int64_t>>();
          saved.box_shape = c.at("box_shape").get<std::vector<int64_t>>();
          saved.numel = numel_of(saved.box_shape);
        } else {
          saved.offset = c.at("offset").get<int64_t>();
          saved.numel = c.at("numel").get<int64_t>();
        }
        check_piece(saved, t.global_shape,
                    fmt::format("load: {}: a chunk of tensor '{}'", manifest_path, t.name));
        // Two flat ranges meet in one range of the flattened tensor (one read); a box on either
        // side needs the tensor's dimensions. (A 0-D tensor has only the flat form.)
        const std::vector<int64_t> view = (want.flat() && saved.flat()) || t.global_shape.empty()
                                              ? std::vector<int64_t>{numel_of(t.global_shape)}
                                              : t.global_shape;
        std::vector<std::array<Part, 3>> reads;  // (saved part, wanted part, their overlap)
        for (const Part& s : parts_of(saved, view))
          for (const Part& w : parts_of(want, view)) {
            const Part o = intersect(s, w);
            if (numel_of(o.size) > 0) reads.push_back({s, w, o});
          }
        if (reads.empty()) continue;
        const std::string file = c.at("file").get<std::string>();
        const ShardHeader& h = header_of(file);
        auto e = h.tensors.find(t.name);
        DTL_CHECK(e != h.tensors.end() && e->second.end - e->second.begin == saved.numel * esize &&
                      (saved.flat() || e->second.shape == saved.box_shape),
                  fmt::format("load: {}: its header does not list tensor '{}' as the manifest "
                              "says", (dir / file).string(), t.name));
        for (const auto& [s, w, o] : reads) {
          read_box((dir / file).string(), h.data_start + e->second.begin, s, w, o, host);
          result.payload_bytes_read += numel_of(o.size) * esize;
          covered += numel_of(o.size);
        }
      }
      DTL_CHECK(covered == want.numel,
                fmt::format("load: {}: the chunks of tensor '{}' hold {} of the {} elements this "
                            "rank wants (a hole, or pieces saved twice)", manifest_path, t.name,
                            covered, want.numel));
      t.local.copy_(host.view(t.local.sizes()));
    }
    // This rank's own tensors only when the ranks are the same ranks.
    if (!result.resharded) {
      const std::string file = shard_name(rank, m);
      const ShardHeader& h = header_of(file);
      for (auto& t : into.per_rank) {
        auto e = h.tensors.find("rank/" + t.name);
        DTL_CHECK(e != h.tensors.end(),
                  fmt::format("load: {} has no per-rank tensor '{}'", (dir / file).string(), t.name));
        torch::Tensor host = torch::empty_like(t.value, t.value.options().device(torch::kCPU));
        DTL_CHECK(static_cast<int64_t>(host.nbytes()) == e->second.end - e->second.begin,
                  fmt::format("load: {}: per-rank tensor '{}' has another size than the model's "
                              "(a checkpoint of another model)", (dir / file).string(), t.name));
        read_bytes((dir / file).string(), h.data_start + e->second.begin, host);
        result.payload_bytes_read += static_cast<int64_t>(host.nbytes());
        t.value.copy_(host);
      }
    }
  } catch (const json::exception& e) {
    error = fmt::format("load: {}: the manifest lacks a key or holds a wrong value: {}",
                        manifest_path, e.what());
  } catch (const std::exception& e) {
    error = e.what();
  }
  raise_if_any(comm, error);
  into.step = result.step;
  into.layout = manifest.value("layout", "");
  into.counters = manifest.at("counters").get<std::map<std::string, int64_t>>();
  return result;
}

}  // namespace

LoadResult load(const std::string& root, Snapshot& into, Comm& comm, const LoadOptions& options) {
  // Every rank reads the same manifest, so a key it lacks throws on every rank at the same point
  // (before the collective that follows it).
  try {
    return load_unchecked(root, into, comm, options);
  } catch (const json::exception& e) {
    const std::string dir = options.checkpoint.empty() ? latest(root) : options.checkpoint;
    throw Error(fmt::format("load: {}/manifest.json lacks a key or holds a wrong value (a damaged "
                            "manifest, or not this format): {}", dir, e.what()));
  }
}

// ---------------------------------------------------------------- Task 4: exact resume

namespace {
// The random generators a step draws from: the CPU one always, the device's when it is a GPU.
std::vector<std::pair<std::string, at::Generator>> generators(const Trainer& t) {
  std::vector<std::pair<std::string, at::Generator>> g = {{"rng/cpu", at::detail::getDefaultCPUGenerator()}};
  const torch::Device d = t.comm().device();
  if (d.is_cuda()) g.emplace_back("rng/cuda", at::globalContext().defaultGenerator(d));
  return g;
}
}  // namespace

Snapshot state_of(Trainer& t) {
  Snapshot s;
  s.step = t.schedule_step;
  s.layout = fmt::format("dp{}-zero1", t.comm().size());
  // Everything the next step reads besides the tensors: AdamW's t (bias correction), the
  // schedule's position (the learning rate), the data stream's position (the next batch).
  s.counters = {{"optimizer_step", t.optimizer_step},
                {"schedule_step", t.schedule_step},
                {"data_position", t.data_position}};
  for (size_t i = 0; i < t.params.size(); ++i) {
    const Range& own = t.owned[i];
    const std::vector<int64_t> shape = t.params[i].sizes().vec();
    // Views: save reads the live values, load writes straight into the trainer.
    s.sharded.push_back({"param/" + t.names[i], shape, own.begin,
                         t.params[i].detach().view({-1}).narrow(0, own.begin, own.size())});
    s.sharded.push_back({"exp_avg/" + t.names[i], shape, own.begin, t.exp_avg[i]});
    s.sharded.push_back({"exp_avg_sq/" + t.names[i], shape, own.begin, t.exp_avg_sq[i]});
  }
  for (auto& [name, gen] : generators(t)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.per_rank.push_back({name, gen.get_state()});
  }
  return s;
}

void restore(Trainer& t, const Snapshot& s, const LoadResult& result) {
  t.optimizer_step = s.counters.at("optimizer_step");
  t.schedule_step = s.counters.at("schedule_step");
  t.data_position = s.counters.at("data_position");
  if (!result.resharded) {  // another world size: other ranks, other streams; keep ours
    for (auto& [name, gen] : generators(t))
      for (const auto& rt : s.per_rank)
        if (rt.name == name) {
          std::lock_guard<std::mutex> lock(gen.mutex());
          gen.set_state(rt.value);
        }
  }
  t.gather_params();  // each rank loaded only its owned slices of the parameters
}

// ---------------------------------------------------------------- Task 5: asynchronous save

struct AsyncSaver::State {
  std::shared_ptr<Comm> comm;  // the background commit's own: never interleaves with training's
  BackgroundWorker worker;
  std::string last;
};

AsyncSaver::AsyncSaver(Comm& comm) : s_(std::make_unique<State>()) { s_->comm = comm.dup(); }

AsyncSaver::~AsyncSaver() {
  try {
    s_->worker.wait();
  } catch (...) {
  }
}

void AsyncSaver::save(const std::string& root, const Snapshot& snapshot, const SaveOptions& options) {
  s_->worker.wait();  // one at a time (and its error surfaces here)
  // The only part training waits for: a copy in host memory (on a GPU, the device-to-host copy).
  Snapshot host = snapshot;
  for (auto& t : host.sharded) t.local = t.local.detach().to(torch::kCPU, false, /*copy=*/true);
  for (auto& t : host.per_rank) t.value = t.value.detach().to(torch::kCPU, false, /*copy=*/true);
  State* s = s_.get();
  s->worker.submit([s, root, host, options] { s->last = dtl::lab17::save(root, host, *s->comm, options); });
}

std::string AsyncSaver::wait() {
  s_->worker.wait();
  return s_->last;
}

}  // namespace dtl::lab17
