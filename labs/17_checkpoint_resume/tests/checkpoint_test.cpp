// Lab 17 public tests: the shard file format, the atomic save, loading with resharding and its
// checks, exact resume (bitwise), the asynchronous save, and jobs killed during a save and
// restarted by a supervisor. Run: ./lab test 17.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.hpp"

namespace lab17_test {
namespace {

using dtl::testing::expect_error_mentions;
using nlohmann::json;

// ---------------------------------------------------------------- Task 1: shard files

TEST(ShardFile, IsInTheSafetensorsLayout) {
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  const std::string path = dir / fmt::format("r{}.safetensors", comm->rank());
  torch::Tensor a = torch::arange(6, torch::kFloat32).reshape({2, 3}).to(device());
  torch::Tensor b = torch::tensor(std::vector<int64_t>{-1, 2, int64_t{1} << 40});
  torch::Tensor c = torch::tensor({1.5, -2.0}, torch::kFloat64);
  const FileInfo info =
      observed(write_shard(path, {{"a", a}, {"b", b}, {"c", c}}, {{"who", "me"}}));
  const std::string bytes = observed_file(path);
  EXPECT_EQ(info.file, fs::path(path).filename().string());
  EXPECT_EQ(info.bytes, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(info.crc32, crc32(bytes.data(), bytes.size()));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "the header is padded to a multiple of 8 bytes";
  ASSERT_LE(8 + n, bytes.size());
  // The real reader (serde_json) and Python's json accept a JSON object followed by spaces, and
  // refuse anything else, a NUL above all (a C-string parser would stop there and miss it).
  const std::string text = bytes.substr(8, n);
  EXPECT_EQ(text.find('\0'), std::string::npos) << "a NUL byte in the header: pad with spaces";
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '{');
  const size_t close = text.rfind('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos)
      << "after the JSON object only spaces may follow";
  const json h = json::parse(text);
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], json({2, 3}));
  EXPECT_EQ(h["a"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "I64");
  EXPECT_EQ(h["b"]["data_offsets"], json({24, 48}));
  EXPECT_EQ(h["c"]["dtype"], "F64");
  EXPECT_EQ(h["__metadata__"]["who"], "me");
  ASSERT_EQ(bytes.size(), 8 + n + 64);
  const char* data = bytes.data() + 8 + n;
  EXPECT_EQ(std::memcmp(data, a.cpu().data_ptr(), 24), 0) << "raw little-endian bytes of a";
  EXPECT_EQ(std::memcmp(data + 24, b.data_ptr(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 48, c.data_ptr(), 16), 0);
}

TEST(ShardFile, HeaderAndByteRangesAreReadAlone) {
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  const std::string path = dir / fmt::format("r{}.safetensors", comm->rank());
  torch::Tensor a = torch::arange(100, torch::kFloat32);
  write_shard(path, {{"x", torch::zeros({3}, torch::kUInt8)}, {"a", a}});
  const ShardHeader raw = read_shard_header(path);
  const ShardHeader h = observed(raw);
  ASSERT_EQ(h.tensors.count("a"), 1u);
  EXPECT_EQ(h.tensors.at("a").dtype, "F32");
  EXPECT_EQ(h.tensors.at("a").shape, std::vector<int64_t>({100}));
  EXPECT_EQ(h.tensors.at("a").begin, 3);
  EXPECT_EQ(h.data_start % 8, 0);
  torch::Tensor part = torch::empty({10}, torch::kFloat32);
  read_bytes(path, raw.data_start + raw.tensors.at("a").begin + 40 * 4, part);
  DTL_EXPECT_EQUAL(part, a.narrow(0, 40, 10));

  expect_error_mentions([&] { read_shard_header(dir / "nothing-here"); }, "missing");
  const std::string bytes = slurp(path);
  spit(path, bytes.substr(0, 20));
  expect_error_mentions([&] { read_shard_header(path); }, "truncated");
  expect_error_mentions([&] { read_bytes(path, 16, part); }, "truncated");
  std::string garbage = bytes;
  garbage[9] = '#';  // inside the JSON
  spit(path, garbage);
  expect_error_mentions([&] { read_shard_header(path); }, "header");
  // A header padded with NUL bytes instead of spaces: the real reader refuses it, so must you.
  const std::string one = R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";  // 53 bytes
  auto file_with = [&](const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
  };
  spit(path, file_with(one + std::string(3, ' '), "abc"));
  EXPECT_EQ(OBSERVE(read_shard_header(path).tensors.at("x").end), 3) << "a hand-made valid file";
  spit(path, file_with(one + std::string(3, '\0'), "abc"));
  expect_error_mentions([&] { read_shard_header(path); }, "header");
}

// ---------------------------------------------------------------- Task 2: save

TEST(Save, CommitsShardsManifestAndLatest) {
  auto comm = fresh_comm();
  const int n = comm->size();
  ScratchDir root(*comm);
  const Snapshot s = test_snapshot(comm->rank(), n, 3);
  const std::string committed = save(root.path(), s, *comm);
  const std::string committed_seen = observed_path(committed, root.path());
  EXPECT_EQ(committed_seen, root / "step-00000003");
  EXPECT_EQ(observed_path(latest(root.path()), root.path()), committed_seen);
  EXPECT_EQ(observed_file(root / "latest"), "step-00000003\n");
  comm->barrier();
  for (const auto& name : observed_listing(root.path()))
    EXPECT_NE(name.rfind(".tmp", 0), 0u) << "left behind: " << root / name;
  const json m = json::parse(observed_file(committed + "/manifest.json"));
  EXPECT_EQ(m["format"], "dtl-checkpoint-1");
  EXPECT_EQ(m["step"], 3);
  EXPECT_EQ(m["world_size"], n);
  EXPECT_EQ(m["layout"], "test");
  EXPECT_EQ(m["counters"]["answer"], 42);
  EXPECT_EQ(m["tensors"]["a"]["shape"], json({5, 7}));
  EXPECT_EQ(m["tensors"]["a"]["dtype"], "F32");
  EXPECT_EQ(m["tensors"]["b"]["dtype"], "I64");
  EXPECT_EQ(m["per_rank"], json({"rank_id"}));
  // Chunks by offset, one per rank that holds elements, covering the tensor.
  int64_t next = 0;
  for (const auto& c : m["tensors"]["a"]["chunks"]) {
    EXPECT_EQ(c["offset"].get<int64_t>(), next);
    next += c["numel"].get<int64_t>();
  }
  EXPECT_EQ(next, 35);
  ASSERT_EQ(m["files"].size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::string file = fmt::format("shard-{:05d}-of-{:05d}.safetensors", r, n);
    ASSERT_TRUE(m["files"].contains(file)) << file;
    const std::string bytes = observed_file(committed + "/" + file);
    EXPECT_EQ(m["files"][file]["rank"], r);
    EXPECT_EQ(m["files"][file]["bytes"].get<int64_t>(), static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(m["files"][file]["crc32"].get<uint32_t>(), crc32(bytes.data(), bytes.size()));
  }
  // This rank's shard holds its slices under their names and its own tensor under rank/.
  const ShardHeader h = observed(read_shard_header(
      committed + fmt::format("/shard-{:05d}-of-{:05d}.safetensors", comm->rank(), n)));
  EXPECT_EQ(h.tensors.count("a"), 1u);
  EXPECT_EQ(h.tensors.count("rank/rank_id"), 1u);
}

TEST(Save, KeepsTheLastKAndIgnoresLeftovers) {
  auto comm = fresh_comm();
  ScratchDir root(*comm);
  if (comm->rank() == 0) {  // what a save killed before its commit leaves behind
    fs::create_directories(root / ".tmp-step-00000009");
    spit(root / ".tmp-step-00000009/manifest.json", "{garbage");
  }
  comm->barrier();
  SaveOptions keep2;
  keep2.keep_last = 2;
  uint64_t pointer = 0;  // the inode of `latest`
  for (int step = 1; step <= 4; ++step) {
    save(root.path(), test_snapshot(comm->rank(), comm->size(), step), *comm, keep2);
    EXPECT_EQ(observed_path(latest(root.path()), root.path()),
              root / fmt::format("step-{:08d}", step));
    struct stat st {};
    const int stat_rc = ::stat((root / "latest").c_str(), &st);
    // (stat's result and the inode: the student's run's file system, MEASURED.)
    const auto [rc, inode] = MEASURED(std::make_pair(stat_rc, static_cast<uint64_t>(st.st_ino)));
    ASSERT_EQ(rc, 0);
    // A file rewritten in place keeps its inode (and a reader may see it half written); a new
    // file renamed over it is another inode (the old one was still in use when it was created).
    if (step > 1) {
      EXPECT_NE(inode, pointer) << "step " << step << ": `latest` was rewritten in place; "
                                << "write a temporary file and rename it over `latest`";
    }
    pointer = inode;
  }
  comm->barrier();
  EXPECT_EQ(observed_listing(root.path()),
            std::vector<std::string>({"latest", "step-00000003", "step-00000004"}));
  expect_error_mentions(
      [&] { save(root.path(), test_snapshot(comm->rank(), comm->size(), 4), *comm); }, "latest");
}

// ---------------------------------------------------------------- Task 3: load

TEST(Load, RoundTripAtTheSameWorldSize) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  const Snapshot saved = test_snapshot(r, n, 7);
  save(root.path(), saved, *comm);
  Snapshot into = empty_like(saved, r, n);
  const LoadResult res = observed(load(root.path(), into, *comm), root.path());
  EXPECT_EQ(res.directory, root / "step-00000007");
  EXPECT_EQ(res.step, 7);
  EXPECT_EQ(res.saved_world_size, n);
  EXPECT_FALSE(res.resharded);
  EXPECT_EQ(OBSERVE(into.step), 7);
  EXPECT_EQ(OBSERVE(into.counters), saved.counters);
  int64_t want = 0;
  for (size_t i = 0; i < saved.sharded.size(); ++i) {
    DTL_EXPECT_EQUAL(into.sharded[i].local.cpu(), saved.sharded[i].local.cpu());
    want += static_cast<int64_t>(saved.sharded[i].local.nbytes());
  }
  DTL_EXPECT_EQUAL(into.per_rank[0].value, saved.per_rank[0].value);
  want += static_cast<int64_t>(saved.per_rank[0].value.nbytes());
  EXPECT_EQ(res.payload_bytes_read, want) << "read exactly this rank's bytes";
}

// Saved by n ranks, loaded by every m in 1..n (a sub-Comm of the first m ranks), and saved by
// 2 ranks, loaded by all n: each rank gets exactly its new slice and reads only those bytes.
TEST(Load, ReshardsToOtherWorldSizes) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  save(root.path(), test_snapshot(r, n, 1), *comm);
  for (int m = 1; m <= n; ++m) {
    on_sub(*comm, comm->split(r < m ? 0 : -1, r), [&](Comm& sub) {
      Snapshot into = empty_like({}, r, m);
      const LoadResult res = observed(load_resharding(root.path(), into, sub), root.path());
      EXPECT_EQ(res.resharded, m != n);
      int64_t bytes = expect_same_slices(into, test_snapshot(r, m, 1),
                                         fmt::format("saved on {} ranks, loaded on {}", n, m));
      if (m != n) {
        EXPECT_EQ(OBSERVE(into.per_rank[0].value.min().item<int>()), -1)
            << "per-rank state kept when resharding";
      } else {
        bytes += static_cast<int64_t>(into.per_rank[0].value.nbytes());
      }
      EXPECT_EQ(res.payload_bytes_read, bytes) << "loaded on " << m << " ranks";
    });
  }
  if (n >= 3) {  // 2 -> n
    ScratchDir two(*comm);
    on_sub(*comm, comm->split(r < 2 ? 0 : -1, r),
           [&](Comm& pair) { save(two.path(), test_snapshot(r, 2, 1), pair); });
    Snapshot into = empty_like({}, r, n);
    load_resharding(two.path(), into, *comm);
    expect_same_slices(into, test_snapshot(r, n, 1), fmt::format("2 -> {}", n));
  }
}

// Each fault on a fresh copy of a good checkpoint; the error names the file and the check.
TEST(Load, DamagedCheckpointsAreRejectedNamingTheFile) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  const std::string good = save(root.path(), test_snapshot(r, n, 5), *comm);
  const std::string shard = "shard-00000-of-" + fmt::format("{:05d}", n) + ".safetensors";
  auto damaged = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string dir = root / name;
    if (r == 0) {
      fs::copy(good, dir, fs::copy_options::recursive);
      damage(dir);
    }
    comm->barrier();
    return dir;
  };
  auto load_dir = [&](const std::string& dir, Snapshot into) {
    LoadOptions opts;
    opts.checkpoint = dir;
    load(root.path(), into, *comm, opts);
  };
  const Snapshot like = empty_like({}, r, n);
  // The copies' names say nothing: an error naming the file must find its word elsewhere.
  const std::string truncated = damaged("copy-1", [&](const std::string& d) {
    const std::string b = slurp(d + "/" + shard);
    spit(d + "/" + shard, b.substr(0, b.size() - 5));
  });
  const std::string flipped = damaged("copy-2", [&](const std::string& d) {
    std::string b = slurp(d + "/" + shard);
    b[b.size() - 3] ^= 0x10;
    spit(d + "/" + shard, b);
  });
  const std::string missing = damaged("copy-3", [&](const std::string& d) { fs::remove(d + "/" + shard); });
  for (const auto& [dir, word] : std::vector<std::pair<std::string, std::string>>{
           {truncated, "truncated"}, {flipped, "checksum"}, {missing, "missing"}}) {
    const std::string msg = dtl::testing::error_of([&] { load_dir(dir, like); });
    EXPECT_NE(msg.find(word), std::string::npos) << "wanted '" << word << "': " << msg;
    EXPECT_NE(msg.find(shard), std::string::npos) << "wanted the file's name " << shard << ": " << msg;
  }
  // Another model: a tensor with another shape.
  Snapshot other = empty_like({}, r, n);
  other.sharded[0].global_shape = {7, 5};
  const std::string msg = dtl::testing::error_of([&] { load(root.path(), other, *comm); });
  EXPECT_NE(msg.find("model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  expect_error_mentions([&] { load(root / "empty", other, *comm); }, "no checkpoint");
  // Another world size, without allow_reshard.
  if (n >= 2) {
    ScratchDir solo(*comm);
    on_sub(*comm, comm->split(r == 0 ? 0 : -1, r),
           [&](Comm& one) { save(solo.path(), test_snapshot(0, 1, 2), one); });
    Snapshot into = empty_like({}, r, n);
    const std::string m2 = dtl::testing::error_of([&] { load(solo.path(), into, *comm); });
    EXPECT_NE(m2.find("world size"), std::string::npos) << m2;
    EXPECT_NE(m2.find("manifest.json"), std::string::npos) << m2;
  }
}

// Tensor parallelism: a column-parallel weight (split on dim 0) and a row-parallel one (split
// on dim 1: each rank holds columns of every row, no flat range) saved as boxes by tp =
// min(2, n) ranks, then loaded whole (tp 1, on every rank) and in quarters (tp 4: each rank
// loads quarter r, r + n, ... in turn). The manifest lists box chunks, each shard stores its box
// with the box's shape, and each rank reads only the bytes of the box it wants.
TEST(Load, TensorParallelBoxesLoadWholeAndInQuarters) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank(), tp = std::min(2, n);
  const torch::Tensor col = seeded({10, 6}, 171), row = seeded({6, 10}, 172);
  auto tp_snapshot = [&](int parts, int part) {
    Snapshot s;
    s.step = 1;
    s.layout = fmt::format("tp{}", parts);
    s.sharded = {tp_piece("col", col, 0, parts, part), tp_piece("row", row, 1, parts, part)};
    return s;
  };
  ScratchDir root(*comm);
  on_sub(*comm, comm->split(r < tp ? 0 : -1, r),
         [&](Comm& sub) { save(root.path(), tp_snapshot(tp, r), sub); });

  const std::string dir = root / "step-00000001";
  const json m = json::parse(observed_file(dir + "/manifest.json"));
  for (const auto& [name, dim] : std::vector<std::pair<std::string, int>>{{"col", 0}, {"row", 1}}) {
    const json& chunks = m["tensors"][name]["chunks"];
    ASSERT_EQ(chunks.size(), static_cast<size_t>(tp)) << name;
    for (int q = 0; q < tp; ++q) {
      const ShardedTensor piece = tp_piece(name, name == "col" ? col : row, dim, tp, q);
      const std::string file = fmt::format("shard-{:05d}-of-{:05d}.safetensors", q, tp);
      EXPECT_EQ(chunks[q], json({{"file", file}, {"box_offset", piece.box_offset},
                                 {"box_shape", piece.local.sizes().vec()}}))
          << name << ": chunk " << q << " is {file, box_offset, box_shape}";
      // The shard is plain safetensors: the box under the tensor's name, with the box's shape.
      const ShardHeader h = observed(read_shard_header(dir + "/" + file));
      ASSERT_EQ(h.tensors.count(name), 1u) << file;
      EXPECT_EQ(h.tensors.at(name).shape, piece.local.sizes().vec()) << file << ": " << name;
    }
  }

  for (const int parts : {1, 4}) {
    for (int round = 0; round == 0 || round * n < parts; ++round) {
      const int part = (round * n + r) % parts;
      const Snapshot want = tp_snapshot(parts, part);
      Snapshot into = zeros_like_pieces(want);
      const LoadResult res = observed(load_resharding(root.path(), into, *comm), root.path());
      const int64_t bytes =
          expect_same_slices(into, want, fmt::format("saved at tp {}, loaded at tp {}: part {}", tp, parts, part));
      EXPECT_EQ(res.payload_bytes_read, bytes) << "tp " << parts << ", part " << part
                                               << ": read exactly the box's bytes";
    }
  }
}

// dp x tp: two layouts of the same tensors, each saved by all n ranks and loaded in both by every
// m in 1..n: ZeRO's flat ranges of every tensor, and boxes split on both dimensions (tp on one,
// the tp part's ranks on the other; dp_tp_piece) with a flat bias beside them. Boxes load into
// flat ranges and flat ranges into boxes, across world sizes, bit for bit.
TEST(Load, DataTimesTensorParallelReshardsToFlatRangesAndBack) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const torch::Tensor col = seeded({10, 6}, 173), row = seeded({6, 10}, 174), bias = seeded({10}, 175);
  auto layout = [&](bool boxes, int rank, int ranks) {
    Snapshot s;
    s.step = 2;
    s.layout = boxes ? "dp-tp" : "zero";
    if (boxes)
      s.sharded = {dp_tp_piece("col", col, 0, 1, rank, ranks), dp_tp_piece("row", row, 1, 0, rank, ranks)};
    else
      s.sharded = {flat_piece("col", col, rank, ranks), flat_piece("row", row, rank, ranks)};
    s.sharded.push_back(flat_piece("bias", bias, rank, ranks));
    return s;
  };
  for (const bool saved_boxes : {true, false}) {
    ScratchDir root(*comm);
    save(root.path(), layout(saved_boxes, r, n), *comm);
    for (int m = 1; m <= n; ++m) {
      on_sub(*comm, comm->split(r < m ? 0 : -1, r), [&](Comm& sub) {
        for (const bool loaded_boxes : {false, true}) {
          const Snapshot want = layout(loaded_boxes, r, m);
          Snapshot into = zeros_like_pieces(want);
          const LoadResult res = observed(load_resharding(root.path(), into, sub), root.path());
          const std::string what = fmt::format("{} on {} ranks, loaded as {} on {}",
                                               saved_boxes ? "dp x tp boxes" : "flat ranges", n,
                                               loaded_boxes ? "dp x tp boxes" : "flat ranges", m);
          const int64_t bytes = expect_same_slices(into, want, what);
          EXPECT_EQ(res.payload_bytes_read, bytes) << what;
        }
      });
    }
  }
}

// A malformed box on one rank (the last) is refused on every rank, in save (nothing committed)
// and in load, with the word "box".
TEST(Load, MalformedBoxesAreRefusedOnEveryRank) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const torch::Tensor w = seeded({4, 6}, 176);
  auto good = [&] {
    Snapshot s;
    s.step = 1;
    s.sharded = {tp_piece("w", w, 1, n, r)};
    return s;
  };
  const std::vector<std::pair<std::string, std::function<void(ShardedTensor&)>>> faults = {
      {"box_offset with one entry for 2 dimensions", [](ShardedTensor& t) { t.box_offset = {0}; }},
      {"box_offset with three entries", [](ShardedTensor& t) { t.box_offset.push_back(0); }},
      {"a negative offset", [](ShardedTensor& t) { t.box_offset[0] = -1; }},
      {"a box past the end of dimension 1",
       [](ShardedTensor& t) { t.box_offset[1] = 6 - t.local.size(1) + 1; }},
      {"a 1-D local for a 2-D box", [](ShardedTensor& t) { t.local = t.local.reshape({-1}); }},
  };
  ScratchDir root(*comm);
  for (const auto& [what, fault] : faults) {
    Snapshot bad = good();
    if (r == n - 1) fault(bad.sharded[0]);
    const std::string msg = dtl::testing::error_of([&] { save(root.path(), bad, *comm); });
    EXPECT_NE(msg.find("box"), std::string::npos) << "save, " << what << " on rank " << n - 1 << ": " << msg;
    EXPECT_EQ(observed_path(latest(root.path()), root.path()), "") << what << ": nothing is committed";
  }
  save(root.path(), good(), *comm);
  for (const auto& [what, fault] : faults) {
    Snapshot into = zeros_like_pieces(good());
    if (r == n - 1) fault(into.sharded[0]);
    const std::string msg = dtl::testing::error_of([&] { load(root.path(), into, *comm); });
    EXPECT_NE(msg.find("box"), std::string::npos) << "load, " << what << " on rank " << n - 1 << ": " << msg;
  }
}

// ---------------------------------------------------------------- Task 4: exact resume

// 6 steps straight == 3 steps, save, everything thrown away (new trainer, scrambled RNG), load,
// 3 steps: bit for bit, with dropout (every rank's RNG), warm-up (the schedule), weight decay.
TEST(Resume, StraightRunEqualsSaveLoadContinueBitwise) {
  auto comm = fresh_comm();
  const TrainConfig cfg = train_config(/*dropout=*/0.1, /*total_steps=*/6);
  ScratchDir root(*comm);
  torch::manual_seed(100 + comm->rank());
  Trainer straight(cfg, *comm);
  std::vector<float> want_losses;
  for (int s = 0; s < 6; ++s) want_losses.push_back(straight.train_step());

  torch::manual_seed(100 + comm->rank());
  {
    Trainer first(cfg, *comm);
    for (int s = 0; s < 3; ++s) first.train_step();
    save(root.path(), state_of(first), *comm);
  }
  torch::manual_seed(999);  // a new process would not have the old generator's state
  Trainer resumed(cfg, *comm);
  Snapshot state = state_of(resumed);
  const LoadResult res = load(root.path(), state, *comm);
  restore(resumed, state, res);
  EXPECT_EQ(OBSERVE(resumed.schedule_step), 3);
  for (int s = 3; s < 6; ++s)
    EXPECT_EQ(OBSERVE(resumed.train_step()), want_losses[s]) << "loss of step " << s + 1;
  DTL_EXPECT_EQUAL(resumed.flat_params(), straight.flat_params());
  for (size_t i = 0; i < straight.exp_avg.size(); ++i) {
    DTL_EXPECT_EQUAL(resumed.exp_avg[i], straight.exp_avg[i]) << straight.names[i];
    DTL_EXPECT_EQUAL(resumed.exp_avg_sq[i], straight.exp_avg_sq[i]) << straight.names[i];
  }
  EXPECT_EQ(OBSERVE(resumed.optimizer_step), straight.optimizer_step);
  EXPECT_EQ(OBSERVE(resumed.data_position), straight.data_position);
}

// Resharded: n -> n/2 (4 -> 2, 2 -> 1) and 2 -> 3: the same trajectory within float
// tolerance (the all-reduce sums in another order), no dropout (other ranks draw other masks).
TEST(Resume, ReshardedRunFollowsTheSameTrajectory) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs 2 ranks or more";
  const TrainConfig cfg = train_config(/*dropout=*/0.0, 6);
  const int from = n == 3 ? 2 : n, to = n == 3 ? 3 : n / 2;
  torch::Tensor want;
  {
    Trainer straight(cfg, *comm);
    for (int s = 0; s < 6; ++s) straight.train_step();
    want = straight.flat_params();
  }
  ScratchDir root(*comm);
  on_sub(*comm, comm->split(r < from ? 0 : -1, r), [&](Comm& a) {
    Trainer first(cfg, a);
    for (int s = 0; s < 3; ++s) first.train_step();
    save(root.path(), state_of(first), a);
  });
  on_sub(*comm, comm->split(r < to ? 0 : -1, r), [&](Comm& b) {
    Trainer resumed(cfg, b);
    Snapshot state = state_of(resumed);
    LoadOptions opts;
    opts.allow_reshard = true;
    const LoadResult res = load(root.path(), state, b, opts);
    EXPECT_TRUE(OBSERVE(res.resharded));
    restore(resumed, state, res);
    for (int s = 3; s < 6; ++s) resumed.train_step();
    DTL_EXPECT_CLOSE(resumed.flat_params(), want, 1e-4, 1e-5) << from << " -> " << to << " ranks";
  });
}

// ---------------------------------------------------------------- Task 5: asynchronous save

// An async save writes what a sync save of the same moment writes, even though training goes
// on (and changes every tensor) while the background thread writes.
TEST(Async, WritesTheSnapshotWhileTrainingGoesOn) {
  auto comm = fresh_comm();
  const int n = comm->size();
  const TrainConfig cfg = train_config(0.1, 6);
  ScratchDir sync_root(*comm), async_root(*comm);
  Trainer t(cfg, *comm);
  t.train_step();
  AsyncSaver saver(*comm);
  save(sync_root.path(), state_of(t), *comm);
  saver.save(async_root.path(), state_of(t));
  t.train_step();  // changes the parameters, moments and RNG the snapshot was taken of
  t.train_step();
  EXPECT_EQ(observed_path(saver.wait(), async_root.path()), async_root / "step-00000001");
  EXPECT_EQ(observed_path(latest(async_root.path()), async_root.path()),
            async_root / "step-00000001");
  for (int r = 0; r < n; ++r) {
    const std::string f = fmt::format("/step-00000001/shard-{:05d}-of-{:05d}.safetensors", r, n);
    EXPECT_EQ(observed_file(async_root.path() + f), observed_file(sync_root.path() + f)) << f;
  }
  EXPECT_EQ(json::parse(observed_file(async_root / "step-00000001/manifest.json")),
            json::parse(observed_file(sync_root / "step-00000001/manifest.json")));
  // Two in a row: the second waits for the first; both commit.
  saver.save(async_root.path(), state_of(t));
  t.train_step();
  saver.save(async_root.path(), state_of(t));
  EXPECT_EQ(observed_path(saver.wait(), async_root.path()), async_root / "step-00000004");
  EXPECT_TRUE(observed_exists(async_root / "step-00000003/manifest.json"));
  EXPECT_EQ(observed_path(latest(async_root.path()), async_root.path()),
            async_root / "step-00000004");
}

// The snapshot is in host memory of the saver's own when save() returns: ranks 1..n-1 hand
// theirs over and overwrite it at once, and rank 0, whose save creates the directory the others
// write into, starts only after that. So no shard of ranks 1..n-1 can have been written before
// its tensors were overwritten: a save that kept the caller's tensors writes the new values.
TEST(Async, SaveCopiesTheSnapshotBeforeItReturns) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks: rank 0's save must start after the others' returned";
  ScratchDir sync_root(*comm), async_root(*comm);
  save(sync_root.path(), test_snapshot(r, n, 1), *comm);
  Snapshot mine = test_snapshot(r, n, 1);
  AsyncSaver saver(*comm);
  auto hand_over = [&] {
    saver.save(async_root.path(), mine);
    for (auto& t : mine.sharded) t.local.fill_(-7);
    for (auto& t : mine.per_rank) t.value.fill_(-7);
  };
  if (r != 0) hand_over();
  comm->barrier();
  if (r == 0) hand_over();
  EXPECT_EQ(observed_path(saver.wait(), async_root.path()), async_root / "step-00000001");
  comm->barrier();
  for (int q = 1; q < n; ++q) {
    const std::string f = fmt::format("/step-00000001/shard-{:05d}-of-{:05d}.safetensors", q, n);
    EXPECT_EQ(observed_file(async_root.path() + f), observed_file(sync_root.path() + f))
        << f << ": the async save wrote values the caller changed after save() returned (copy "
        << "every tensor to host memory of your own before returning)";
  }
}

// ---------------------------------------------------------------- faults: new processes

// A 2-rank job, rank 1 killed (SIGKILL) in the save of step 4, after writing its shard: the job
// dies, `latest` still names step 2, which loads; the supervisor restarts the job, which
// resumes from step 2 in new processes, and the final parameters equal an uninterrupted run's.
TEST(Supervisor, RankKilledDuringSaveResumesBitwise) {
  LAB17_ONLY_AT_WORLD_SIZE_1();
  auto comm = fresh_comm();
  ScratchDir straight(*comm), killed(*comm);
  const auto clean =
      measured(dtl::testing::run_job("lab17_train", 2, {"dir=" + straight.path()}, 90));
  ASSERT_TRUE(clean.ok()) << clean.describe();
  const auto runs = measured(supervise(2, {"dir=" + killed.path()}, "rank=1,step=4,at=shard"));
  ASSERT_FALSE(runs.empty());
  ASSERT_GE(runs.size(), 2u) << "the first attempt should have been killed: " << runs[0].describe();
  EXPECT_EQ(runs[0].signal, 9) << runs[0].describe();
  EXPECT_NE(runs[1].output.find("resumed_from=2 "), std::string::npos) << runs[1].describe();
  ASSERT_TRUE(runs.back().ok()) << runs.back().describe();
  // The restarted job's parameters, from the file it wrote (the check observes them); the
  // uninterrupted run's are this run's own (the oracle: the given trainer without a fault).
  DTL_EXPECT_EQUAL(final_params(killed.path()), final_params(straight.path()));
}

// Rank 0 killed at the commit of step 4 (manifest written, not yet renamed): nothing of step 4
// is visible; the previous checkpoint loads (here, in this 1-rank job: resharded 3 -> 1).
TEST(Supervisor, KilledAtCommitLeavesThePreviousCheckpointLoadable) {
  LAB17_ONLY_AT_WORLD_SIZE_1();
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  const auto run =
      measured(dtl::testing::run_job("lab17_train", 3, {"dir=" + dir.path(), "async=1"}, 90,
                                     {"DTL_LAB17_FAULT=rank=0,step=4,at=commit"}));
  EXPECT_EQ(run.signal, 9) << run.describe();
  EXPECT_EQ(observed_path(latest(dir.path()), dir.path()), dir / "step-00000002");
  EXPECT_FALSE(observed_exists(dir / "step-00000004"));
  Trainer t(train_config(), *comm);
  Snapshot state = state_of(t);
  LoadOptions opts;
  opts.allow_reshard = true;
  const LoadResult res = load(dir.path(), state, *comm, opts);
  const LoadResult got = observed(res, dir.path());
  EXPECT_EQ(got.step, 2);
  EXPECT_EQ(got.saved_world_size, 3);
  restore(t, state, res);
  EXPECT_EQ(OBSERVE(t.schedule_step), 2);
}

}  // namespace
}  // namespace lab17_test
