// Lab 19 demo: Megatron's process groups for any layout, and a Megatron command line or a
// DeepSpeed config translated into the course's plan.
//
//   ./lab run 19                                        the 16-GPU docstring example (tp 2, pp 4)
//   ./lab run 19 -- --world 8 --tp 4 --cp 2 --pp 1      context parallelism's groups
//   ./lab run 19 -- --world 64 --tp 2 --ep 4 --pp 2     the dense and the expert grids
//   ./lab run 19 -- --megatron "--tensor-model-parallel-size 2 --micro-batch-size 2" --world 8
//   ./lab run 19 -- --deepspeed ds_config.json --world 8 --tp 2
//   ./lab run 19 -n 4 -- --world 4 --tp 2 --pp 1       also build the groups over 4 real ranks
//   ./lab run 19 -- --json groups.json                  also every group list as data (./lab
//   figures)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dtl/cli.hpp"      // defines: add_model_options
#include "dtl/error.hpp"    // defines: dtl::Error
#include "dtl/log.hpp"      // defines: print0
#include "dtl/runtime.hpp"  // defines: Runtime, RuntimeOptions
#include "parallel_state.hpp"

namespace {

using dtl::lab19::RankGenerator;

std::string groups_line(const std::vector<std::vector<int>>& groups, size_t most = 8) {
  std::string out;
  for (size_t g = 0; g < groups.size() && g < most; ++g) out += fmt::format("[{}] ", fmt::join(groups[g], ","));
  if (groups.size() > most) out += fmt::format("... ({} groups)", groups.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lab 19: how to read Megatron-LM and DeepSpeed structurally"};
  dtl::RuntimeOptions opts = dtl::RuntimeOptions::from_env();
  opts.add_to(app);
  int world = 16, tp = 2, cp = 1, ep = 1, pp = 4;
  std::string order = "tp-cp-ep-dp-pp", megatron, deepspeed;
  dtl::lab19::GPTConfig model;
  model.n_layer = 8;
  model.n_head = 8;
  model.vocab_size = 256;
  model.seq_len = 64;
  app.add_option("--world", world, "ranks of the layout to print")->capture_default_str();
  app.add_option("--tp", tp, "tensor parallel size")->capture_default_str();
  app.add_option("--cp", cp, "context parallel size")->capture_default_str();
  app.add_option("--ep", ep, "expert parallel size")->capture_default_str();
  app.add_option("--pp", pp, "pipeline parallel size")->capture_default_str();
  app.add_option("--order", order, "Megatron's order string, fastest first")->capture_default_str();
  app.add_option("--megatron", megatron, "a Megatron command line to translate (one string)");
  app.add_option("--deepspeed", deepspeed, "a DeepSpeed JSON config file to translate (with --tp, --pp)");
  dtl::add_model_options(app, model);
  std::string json_path;
  app.add_option("--json", json_path, "also write the layout's group lists to this file");
  CLI11_PARSE(app, argc, argv);

  try {
    dtl::Runtime rt(opts, argc, argv);
    if (!megatron.empty() || !deepspeed.empty()) {
      if (!megatron.empty()) {
        std::istringstream in(megatron);
        std::vector<std::string> args;
        for (std::string a; in >> a;) args.push_back(a);
        dtl::print0("Megatron  {}\n  -> {}", megatron, dtl::lab19::from_megatron_args(args, world, model).to_string());
      }
      if (!deepspeed.empty()) {
        std::ifstream f(deepspeed);
        DTL_CHECK(f.good(), fmt::format("--deepspeed: cannot read {}", deepspeed));
        std::stringstream text;
        text << f.rdbuf();
        dtl::print0("DeepSpeed {} (tp {}, pp {})\n  -> {}", deepspeed, tp, pp,
                    dtl::lab19::from_deepspeed_config(text.str(), world, tp, pp, model).to_string());
      }
      return 0;
    }
    DTL_CHECK(world % (tp * cp * pp) == 0,
              fmt::format("--world {} is not divisible by tp {} x cp {} x pp {}", world, tp, cp, pp));
    const int dp = world / (tp * cp * pp);
    const RankGenerator dense(tp, 1, dp, pp, cp, order);
    dtl::print0("{} ranks: tp {} x cp {} x dp {} x pp {}, order {} (first fastest)\n", world, tp, cp,
                dp, pp, dense.order());
    for (const char* token : {"tp", "cp", "dp", "pp", "dp-cp", "tp-dp", "tp-pp"})
      dtl::print0("  {:<10} {}", token, groups_line(dense.get_ranks(token)));
    std::vector<std::vector<int>> embedding;
    for (const auto& p : dense.get_ranks("pp"))
      embedding.push_back(p.size() == 1 ? std::vector<int>{p.front()} : std::vector<int>{p.front(), p.back()});
    dtl::print0("  {:<10} {}", "embedding", groups_line(embedding));
    if (!json_path.empty() && rt.rank() == 0) {
      nlohmann::json groups = {{"embedding", embedding}};
      for (const char* token : {"tp", "cp", "dp", "pp", "dp-cp", "tp-dp", "tp-pp"})
        groups[token] = dense.get_ranks(token);
      const nlohmann::json doc = {{"world", world},  {"tp", tp}, {"cp", cp},
                                  {"dp", dp},        {"pp", pp}, {"order", dense.order()},
                                  {"groups", groups}};
      std::ofstream(json_path) << doc.dump(1) << "\n";
    }
    if (ep > 1) {
      DTL_CHECK((dp * cp) % ep == 0, fmt::format("--ep {} must divide dp x cp = {}", ep, dp * cp));
      const RankGenerator expert(tp, ep, dp * cp / ep, pp, 1, order);
      dtl::print0("\nexpert grid: tp {} x ep {} x expert dp {} x pp {}", tp, ep, dp * cp / ep, pp);
      for (const char* token : {"ep", "dp", "tp-ep"})
        dtl::print0("  {:<10} {}", token, groups_line(expert.get_ranks(token)));
    }
    if (rt.world_size() > 1) {
      DTL_CHECK(rt.world_size() == world,
                fmt::format("-n {} ranks but --world {}: run with as many ranks as the layout", rt.world_size(), world));
      dtl::lab19::ParallelConfig c;
      c.tp = tp;
      c.cp = cp;
      c.ep = ep;
      c.pp = pp;
      c.order = order;
      dtl::lab19::ParallelState ps(rt.world(), c);
      for (int r = 0; r < rt.world_size(); ++r) {
        if (r == rt.rank())
          fmt::print("rank {}: tp {} cp {} dp {} pp {}; tp comm {} of {}, dp comm {} of {}\n", r,
                     ps.coord("tp"), ps.coord("cp"), ps.coord("dp"), ps.coord("pp"), ps.comm("tp").rank(),
                     ps.comm("tp").size(), ps.comm("dp").rank(), ps.comm("dp").size());
        std::fflush(stdout);
        rt.world().barrier();
      }
    }
  } catch (const dtl::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
