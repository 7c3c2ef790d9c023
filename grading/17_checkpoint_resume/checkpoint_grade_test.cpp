// Grading tests of lab 17 (hidden from students until the due date). They check nothing the
// header does not promise: every dtype of the safetensors names, every world size to every
// other (flat ranges, and boxes of a 3-D tensor), more kinds of damage (and verify_checksums
// off), keep_last 1 and re-saving a step `latest` does not name, a longer exact resume, an async
// save whose error reaches wait() on every rank, and a job killed on 4 ranks and restarted on 2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "tests/checkpoint_test_util.hpp"

namespace lab17_test {
namespace {

using nlohmann::json;

TEST(GradeShard, EveryDtypeRoundTrips) {
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  const std::string path = dir / fmt::format("r{}.safetensors", comm->rank());
  std::vector<ShardEntry> entries = {
      {"f64", torch::randn({3, 2}, torch::kFloat64)},
      {"f16", torch::randn({5}).to(torch::kFloat16)},
      {"bf16", torch::randn({4}).to(torch::kBFloat16)},
      {"i32", torch::arange(7, torch::kInt32)},
      {"u8", torch::arange(9, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"empty", torch::zeros({0}, torch::kFloat32)},
      {"transposed", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()}};  // written contiguous
  write_shard(path, entries);
  const ShardHeader raw = read_shard_header(path);
  const ShardHeader h = observed(raw);
  for (const auto& e : entries) {
    ASSERT_EQ(h.tensors.count(e.name), 1u) << e.name;
    const HeaderEntry& he = h.tensors.at(e.name);
    EXPECT_EQ(he.dtype, safetensors_dtype(e.data.scalar_type())) << e.name;
    EXPECT_EQ(he.shape, e.data.sizes().vec()) << e.name;
    EXPECT_EQ(he.end - he.begin, static_cast<int64_t>(e.data.nbytes())) << e.name;
    torch::Tensor back = torch::empty(e.data.sizes(), e.data.options());  // contiguous
    read_bytes(path, raw.data_start + raw.tensors.at(e.name).begin, back);
    DTL_EXPECT_EQUAL(back, e.data) << e.name;
  }
}

// Headers the real safetensors reader refuses (Metadata::validate, read_metadata), each in an
// otherwise valid file: every one is "header".
TEST(GradeShard, TheReaderRefusesWhatSafetensorsRefuses) {
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  const std::string path = dir / fmt::format("r{}.safetensors", comm->rank());
  auto file_with = [&](std::string header, const std::string& data) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
  };
  auto entry = [](const char* name, const char* dtype, const char* shape, int b, int e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype, shape, b, e);
  };
  const std::string data(16, 'z');
  // Valid: two F32 tensors tiling 16 bytes, listed in any order.
  spit(path, file_with("{" + entry("b", "F32", "[2]", 8, 16) + "," + entry("a", "F32", "[2]", 0, 8) + "}", data));
  ASSERT_EQ(OBSERVE(read_shard_header(path).tensors.size()), 2u);
  // Valid too: JSON whitespace before the object (the real reader skips it).
  spit(path, file_with(" \n{" + entry("a", "F32", "[4]", 0, 16) + "}", data));
  EXPECT_EQ(OBSERVE(read_shard_header(path).tensors.size()), 1u) << "whitespace before the object";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a hole between the ranges", "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[2]", 8, 16) + "}"},
      {"overlapping ranges", "{" + entry("a", "F32", "[3]", 0, 12) + "," + entry("b", "F32", "[2]", 8, 16) + "}"},
      {"trailing bytes after the last range", "{" + entry("a", "F32", "[2]", 0, 8) + "}"},
      {"begin > end", "{" + entry("a", "F32", "[0]", 16, 0) + "}"},
      {"a range longer than shape x dtype", "{" + entry("a", "F32", "[3]", 0, 16) + "}"},
      {"a range shorter than shape x dtype", "{" + entry("a", "F64", "[3]", 0, 16) + "}"},
      {"an unknown dtype", "{" + entry("a", "F33", "[4]", 0, 16) + "}"},
      {"no shape", R"({"a":{"dtype":"F32","data_offsets":[0,16]}})"},
      {"a shape entry that is not an integer", "{" + entry("a", "F32", "[4.0]", 0, 16) + "}"},
      {"a negative shape entry", "{" + entry("a", "F32", "[-4]", 0, 16) + "}"},
      {"three data_offsets", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})"},
      {"a data_offset that is not an integer", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16.0]}})"},
  };
  for (const auto& [what, header] : bad) {
    spit(path, file_with(header, data));
    const std::string msg = dtl::testing::error_of([&] { read_shard_header(path); });
    EXPECT_NE(msg.find("header"), std::string::npos) << what << ": " << msg;
  }
}

// A manifest that lacks a key load() reads: a dtl::Error naming the manifest and the key (in
// quotes), not a crash. (Every load error names manifest.json's path; the key is the test.)
TEST(GradeLoad, AManifestWithoutAKeyIsNamed) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  const std::string good = save(root.path(), test_snapshot(r, n, 5), *comm);
  int k = 0;
  for (const char* key : {"tensors", "files", "counters"}) {
    const std::string copy = root / fmt::format("copy-{}", ++k);
    if (r == 0) {
      fs::copy(good, copy, fs::copy_options::recursive);
      json m = json::parse(slurp(copy + "/manifest.json"));
      m.erase(key);
      spit(copy + "/manifest.json", m.dump());
    }
    comm->barrier();
    Snapshot into = empty_like({}, r, n);
    LoadOptions opts;
    opts.checkpoint = copy;
    const std::string msg = dtl::testing::error_of([&] { load(root.path(), into, *comm, opts); });
    EXPECT_NE(msg.find("manifest"), std::string::npos) << msg;
    EXPECT_TRUE(msg.find(fmt::format("'{}'", key)) != std::string::npos ||
                msg.find(fmt::format("\"{}\"", key)) != std::string::npos)
        << "the error should name the missing key " << key << ": " << msg;
  }
}

// Saved by k ranks, loaded by m ranks, for every k and m up to the world size.
TEST(GradeLoad, EveryWorldSizeToEveryOther) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  for (int k = 1; k <= n; ++k) {
    ScratchDir root(*comm);
    on_sub(*comm, comm->split(r < k ? 0 : -1, r),
           [&](Comm& saver) { save(root.path(), test_snapshot(r, k, k), saver); });
    for (int m = 1; m <= n; ++m) {
      on_sub(*comm, comm->split(r < m ? 0 : -1, r), [&](Comm& sub) {
        Snapshot into = empty_like({}, r, m);
        const LoadResult res = observed(load_resharding(root.path(), into, sub), root.path());
        EXPECT_EQ(res.saved_world_size, k);
        EXPECT_EQ(OBSERVE(into.step), k);
        int64_t bytes = expect_same_slices(into, test_snapshot(r, m, k), fmt::format("{} -> {}", k, m));
        if (k == m) bytes += static_cast<int64_t>(into.per_rank[0].value.nbytes());
        EXPECT_EQ(res.payload_bytes_read, bytes) << k << " -> " << m;
      });
    }
  }
}

// Boxes of a 3-D float32 tensor and a 2-D bfloat16 one, in three layouts (boxes split on two
// dimensions, boxes split on dim 0 with an empty box at 4 ranks, flat ranges), saved by k ranks
// and loaded in every layout by m ranks, for every k and m up to the world size. Each saving
// rank's shard holds its boxes as plain safetensors entries: the box's shape, its bytes.
TEST(GradeLoad, BoxesOfEveryLayoutEveryWorldSizeToEveryOther) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  const torch::Tensor t = seeded({3, 5, 4}, 1701), h = seeded({7, 3}, 1702, torch::kBFloat16);
  auto layout = [&](int kind, int rank, int ranks) {
    Snapshot s;
    s.step = 4;
    if (kind == 0)
      s.sharded = {dp_tp_piece("t", t, 2, 1, rank, ranks), dp_tp_piece("h", h, 1, 0, rank, ranks)};
    else if (kind == 1)
      s.sharded = {tp_piece("t", t, 0, ranks, rank), tp_piece("h", h, 0, ranks, rank)};
    else
      s.sharded = {flat_piece("t", t, rank, ranks), flat_piece("h", h, rank, ranks)};
    return s;
  };
  const char* names[] = {"boxes on two dims", "boxes on dim 0", "flat ranges"};
  for (int k = 1; k <= n; ++k) {
    for (int saved = 0; saved < 3; ++saved) {
      ScratchDir root(*comm);
      on_sub(*comm, comm->split(r < k ? 0 : -1, r), [&](Comm& saver) {
        const Snapshot mine = layout(saved, r, k);
        save(root.path(), mine, saver);
        const std::string path = root / fmt::format("step-00000004/shard-{:05d}-of-{:05d}.safetensors", r, k);
        const ShardHeader raw = read_shard_header(path);
        const ShardHeader hdr = observed(raw);
        for (const auto& piece : mine.sharded) {
          ASSERT_EQ(hdr.tensors.count(piece.name), 1u) << path;
          EXPECT_EQ(hdr.tensors.at(piece.name).shape, piece.local.sizes().vec()) << path << ": " << piece.name;
          torch::Tensor back = torch::empty(piece.local.sizes(), piece.local.options().device(torch::kCPU));
          read_bytes(path, raw.data_start + raw.tensors.at(piece.name).begin, back);
          DTL_EXPECT_EQUAL(back, piece.local.cpu()) << path << ": " << piece.name << " holds its piece's bytes";
        }
      });
      for (int m = 1; m <= n; ++m) {
        on_sub(*comm, comm->split(r < m ? 0 : -1, r), [&](Comm& sub) {
          for (int loaded = 0; loaded < 3; ++loaded) {
            const Snapshot want = layout(loaded, r, m);
            Snapshot into = zeros_like_pieces(want);
            const LoadResult res = observed(load_resharding(root.path(), into, sub), root.path());
            const std::string what = fmt::format("{} on {} ranks, loaded as {} on {}", names[saved],
                                                 k, names[loaded], m);
            const int64_t bytes = expect_same_slices(into, want, what);
            EXPECT_EQ(res.payload_bytes_read, bytes) << what;
          }
        });
      }
    }
  }
}

TEST(GradeLoad, MoreDamage) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  const std::string good = save(root.path(), test_snapshot(r, n, 5), *comm);
  const std::string last = fmt::format("shard-{:05d}-of-{:05d}.safetensors", n - 1, n);
  const std::string header_flip = root / "copy-1", data_flip = root / "copy-2";
  if (r == 0) {
    fs::copy(good, header_flip, fs::copy_options::recursive);
    std::string b = slurp(header_flip + "/" + last);
    b[12] ^= 0x01;  // inside the last rank's JSON header
    spit(header_flip + "/" + last, b);
    fs::copy(good, data_flip, fs::copy_options::recursive);
    b = slurp(data_flip + "/" + last);
    b[b.size() - 1] ^= 0x40;  // the last byte of the last rank's data
    spit(data_flip + "/" + last, b);
  }
  comm->barrier();
  Snapshot into = empty_like({}, r, n);
  LoadOptions opts;
  opts.checkpoint = header_flip;
  // A flipped header byte breaks the checksum and the header: either word names it.
  const std::string msg = dtl::testing::error_of([&] { load(root.path(), into, *comm, opts); });
  EXPECT_TRUE(msg.find("checksum") != std::string::npos || msg.find("header") != std::string::npos) << msg;
  EXPECT_NE(msg.find(last), std::string::npos) << msg;
  // Without verification the flipped data byte loads (the check costs a full read of every file).
  opts.checkpoint = data_flip;
  opts.verify_checksums = false;
  std::string raised = "(no exception)";
  try {
    load(root.path(), into, *comm, opts);
  } catch (const std::exception& e) {
    raised = e.what();
  } catch (...) {
    raised = "(an exception)";
  }
  EXPECT_EQ(OBSERVE(raised), "(no exception)");
  // `latest` naming a directory that is gone.
  if (r == 0) spit(root / "latest", "step-00000077\n");
  comm->barrier();
  dtl::testing::expect_error_mentions([&] { load(root.path(), into, *comm); }, "no checkpoint");
}

TEST(GradeSave, KeepLastOneAndReplaceAStepLatestDoesNotName) {
  auto comm = fresh_comm();
  const int n = comm->size(), r = comm->rank();
  ScratchDir root(*comm);
  SaveOptions one;
  one.keep_last = 1;
  save(root.path(), test_snapshot(r, n, 5), *comm, one);
  if (r == 0) {  // a step-6 left by a job killed between its rename and its `latest`
    fs::create_directories(root / "step-00000006");
    spit(root / "step-00000006/manifest.json", "{}");
  }
  comm->barrier();
  save(root.path(), test_snapshot(r, n, 6), *comm, one);
  comm->barrier();
  EXPECT_EQ(observed_listing(root.path()), std::vector<std::string>({"latest", "step-00000006"}));
  Snapshot into = empty_like({}, r, n);
  EXPECT_EQ(OBSERVE(load(root.path(), into, *comm).step), 6);
  DTL_EXPECT_EQUAL(into.sharded[0].local.cpu(), test_snapshot(r, n, 6).sharded[0].local.cpu());
}

TEST(GradeResume, SevenStepsSavedAtFourWithoutWarmupBitwise) {
  auto comm = fresh_comm();
  TrainConfig cfg = train_config(0.2, 7);
  cfg.global_batch = 5;
  cfg.optim.warmup_steps = 0;
  ScratchDir root(*comm);
  torch::manual_seed(7 + comm->rank());
  Trainer straight(cfg, *comm);
  for (int s = 0; s < 7; ++s) straight.train_step();
  torch::manual_seed(7 + comm->rank());
  {
    Trainer first(cfg, *comm);
    for (int s = 0; s < 4; ++s) first.train_step();
    save(root.path(), state_of(first), *comm);
  }
  torch::manual_seed(12345);
  Trainer resumed(cfg, *comm);
  Snapshot state = state_of(resumed);
  restore(resumed, state, load(root.path(), state, *comm));
  for (int s = 4; s < 7; ++s) resumed.train_step();
  DTL_EXPECT_EQUAL(resumed.flat_params(), straight.flat_params());
}

// The save fails on every rank (ROOT is a file); wait() raises a dtl::Error on every rank
// instead of hanging or crashing.
TEST(GradeAsync, AnErrorReachesWaitOnEveryRank) {
  auto comm = fresh_comm();
  ScratchDir dir(*comm);
  if (comm->rank() == 0) spit(dir / "not-a-directory", "x");
  comm->barrier();
  AsyncSaver saver(*comm);
  saver.save(dir / "not-a-directory", test_snapshot(comm->rank(), comm->size(), 1));
  EXPECT_NE(dtl::testing::error_of([&] { saver.wait(); }), "(no dtl::Error)");
}

TEST(GradeSupervisor, KilledOnFourRanksRestartedOnTwo) {
  LAB17_ONLY_AT_WORLD_SIZE_1();
  auto comm = fresh_comm();
  ScratchDir straight(*comm), killed(*comm);
  const auto clean = measured(
      dtl::testing::run_job("lab17_train", 4, {"dir=" + straight.path(), "dropout=0"}, 90));
  ASSERT_TRUE(clean.ok()) << clean.describe();
  const auto runs =
      measured(supervise(4, {"dir=" + killed.path(), "dropout=0"}, "rank=3,step=4,at=shard", 3,
                         /*restart_ranks=*/2));
  ASSERT_FALSE(runs.empty());
  ASSERT_GE(runs.size(), 2u) << runs[0].describe();
  EXPECT_EQ(runs[0].signal, 9) << runs[0].describe();
  EXPECT_NE(runs[1].output.find("resumed_from=2 resharded=1"), std::string::npos) << runs[1].describe();
  ASSERT_TRUE(runs.back().ok()) << runs.back().describe();
  // The restarted job's parameters, from the file it wrote (the check observes them); the
  // uninterrupted run's are this run's own (the oracle: the given trainer without a fault).
  DTL_EXPECT_CLOSE(final_params(killed.path()), final_params(straight.path()), 1e-4, 1e-5);
}

}  // namespace
}  // namespace lab17_test
