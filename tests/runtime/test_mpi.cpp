// Parallel layouts under mpirun (Open MPI on localhost, two ranks: expert, pipeline and
// tensor parallelism): every golden case's logits against the single-process run and the
// golden reference, greedy `dsa run` ids, and the layouts and failures that must end in one
// clear error instead of a hang.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <tuple>
#include <thread>

#include "fixtures.h"
#include "io/safetensors.h"
#include "runtime/dist.h"
#include "tiny_model.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace dsa;

namespace {

// A clear skip, never a silent pass, where this build cannot run MPI jobs.
#define DSA_NEED_MPI()                                                                                           \
  do {                                                                                                           \
    if (!dist::built_with_mpi()) GTEST_SKIP() << "dsa was built without MPI (install libopenmpi-dev and rebuild)"; \
    if (test::shell("command -v mpirun >/dev/null 2>&1").code != 0) GTEST_SKIP() << "mpirun not found (install openmpi-bin)"; \
  } while (0)

// Two ranks on this machine, one thread each; `timeout` turns a hang into a failure.
std::string mpirun(int np) {
  return "timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np " + std::to_string(np) + " ";
}

struct Case {
  std::string dir, ids, args;  // args: --ids ... --prompt-len ... --kv-cache ...
  bool fp8 = false, mtp = false;
};

Case read_case(const std::string& name) {
  Case c;
  c.dir = test::golden_dir() + "/" + name;
  std::ifstream in(c.dir + "/case.json");
  const auto cj = nlohmann::json::parse(in);
  for (int32_t id : cj.at("ids").get<std::vector<int32_t>>()) {
    if (!c.ids.empty()) c.ids += ',';
    c.ids += std::to_string(id);
  }
  c.fp8 = cj.at("kv_cache").get<std::string>() == "fp8";
  c.mtp = SafeTensors::open(c.dir + "/expected.safetensors").has("mtp.logits");
  c.args = " --model " + c.dir + "/model --ids " + c.ids + " --prompt-len " + std::to_string(cj.at("prompt_len").get<int>()) +
           " --kv-cache " + (c.fp8 ? "fp8" : "f32") + (c.mtp ? " --mtp" : "");
  return c;
}

std::vector<float> floats(const SafeTensors& st, const std::string& name) {
  const TensorInfo& t = st.get(name);
  std::vector<float> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// max |a - b| over max |b| (finite entries of b; an infinite entry must match).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double mx = 0, err = 0;
  for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
    if (!std::isfinite(b[i])) {
      EXPECT_EQ(a[i], b[i]) << "entry " << i;
      continue;
    }
    mx = std::max(mx, double(std::fabs(b[i])));
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
  }
  return err / std::max(mx, 1e-30);
}

// How far a parallel layout's logits may be from one process's: 1e-5 relative, for every
// cache format. The layouts are built to give one process's bits: expert parallelism sums
// the ranks' partial outputs unrounded (moe.cpp), tensor parallelism gathers whole heads and
// output columns instead of summing partial products, and a head's attention does not depend
// on how many heads share the kernel call. An fp8 latent cache leaves no room for less: a
// difference of an ulp can move a cached value across an e4m3 rounding step (1/16 of it) and
// the rows that attend to it by about 1e-3.
constexpr double kOneProcessBound = 1e-5;

// check(name, case) on every golden case the README lists (a missing one fails).
template <class F>
void for_every_case(F check) {
  const auto cases = test::golden_cases();
  ASSERT_TRUE(test::golden_cases_complete(cases));
  for (const auto& name : cases) {
    SCOPED_TRACE(name);
    check(name, read_case(name));
  }
}

// The two-rank layouts: experts split, layers split, attention heads split, and experts
// split with each rank attending for its own sequences (with one sequence, rank 1 has none
// and takes part in the MoE exchanges with no tokens).
const char* const kLayouts[] = {"--ep 2", "--pp 2", "--tp 2", "--ep 2 --dp"};

// A file name part for a layout: "ep", "pp", "tp", "ep_dp".
std::string layout_tag(const std::string& layout) {
  std::string t;
  for (size_t i = 0; i + 3 < layout.size(); ++i)
    if (layout[i] == '-' && layout[i + 1] == '-') {
      if (!t.empty()) t.push_back('_');
      t.push_back(layout[i + 2]);
      t.push_back(layout[i + 3]);
    }
  return t;
}

// One process's logits for a case, in a scratch file named after `tag` (a failed run fails
// the test, and opening the missing file then throws).
std::string one_process_logits(const std::string& tag, const Case& c) {
  const std::string out = test::scratch(tag + ".safetensors");
  const auto r = test::shell(test::dsa_binary() + " logits" + c.args + " --out " + out + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  return out;
}

TEST(Mpi, ParallelLogitsMatchOneProcessOnEveryGoldenCase) {
  DSA_NEED_MPI();
  for_every_case([](const std::string& name, const Case& c) {
    const SafeTensors a = SafeTensors::open(one_process_logits(name + "_one", c)), want = SafeTensors::open(c.dir + "/expected.safetensors");
    // Each layout, and data-parallel attention once more with its tokens sent all-to-all
    // (two ranks otherwise gather them).
    std::vector<std::pair<std::string, std::string>> runs;
    for (const std::string layout : kLayouts) runs.emplace_back(layout, "");
    runs.emplace_back("--ep 2 --dp", "-x DSA_MOE_DISPATCH=alltoall ");
    for (const auto& [layout, env] : runs) {
      SCOPED_TRACE(env + layout);
      const std::string out = test::scratch(name + "_" + layout_tag(layout) + ".safetensors");
      const auto r2 = test::shell(mpirun(2) + env + test::dsa_binary() + " logits" + c.args + " " + layout + " --out " + out + " 2>&1");
      ASSERT_EQ(r2.code, 0) << r2.out;
      const SafeTensors b = SafeTensors::open(out);
      for (const std::string t : {"logits", "mtp.logits"}) {
        if (t == "mtp.logits" && !c.mtp) continue;
        SCOPED_TRACE(t);
        const auto got = floats(b, t);
        // Within kOneProcessBound of one process; and within the golden README's bound.
        const double e1 = rel_err(got, floats(a, t)), eg = rel_err(got, floats(want, t));
        EXPECT_LE(e1, kOneProcessBound) << "against one process";
        EXPECT_LE(eg, c.fp8 ? 3e-2 : 1e-4) << "against the golden reference";
        std::printf("[ mpi ] %-24s %-10s %s%s vs one process %.2e, vs golden %.2e\n", name.c_str(), t.c_str(), layout.c_str(),
                    env.empty() ? "" : " (all-to-all)", e1, eg);
      }
    }
  });
}

// Four ranks: two pipeline stages whose two ranks split the experts, the heads or both, or
// attend for sequences of their own (stage communicators under the stage-to-stage transfers).
TEST(Mpi, CombinedLayoutsOnFourRanksMatchOneProcess) {
  DSA_NEED_MPI();
  const auto cases = test::golden_cases();
  ASSERT_FALSE(cases.empty());
  const Case c = read_case(cases.front());
  const std::string one = one_process_logits("combined_one", c);
  for (const std::string layout : {"--pp 2 --ep 2", "--pp 2 --tp 2", "--pp 2 --ep 2 --tp 2", "--pp 2 --ep 2 --dp", "--pp 4"}) {
    SCOPED_TRACE(layout);
    const std::string out = test::scratch("combined.safetensors");
    const auto r4 = test::shell(mpirun(4) + test::dsa_binary() + " logits" + c.args + " " + layout + " --out " + out + " 2>&1");
    if (layout == "--pp 4" && r4.code != 0) {  // a case with fewer layers than stages is refused, by name
      EXPECT_NE(r4.out.find("more pipeline stages than"), std::string::npos) << r4.out;
      continue;
    }
    ASSERT_EQ(r4.code, 0) << r4.out;
    EXPECT_LE(rel_err(floats(SafeTensors::open(out), "logits"), floats(SafeTensors::open(one), "logits")), kOneProcessBound);
  }
}

// Pipeline micro-batches: the teacher-forced sequence steps beside eight others, so the
// stages split each step into groups of sequences (by default, and into three when asked),
// alone and with the stage's ranks splitting the experts or the heads; its logits are one
// process's. Groups that took the wrong rows of the final hidden states fail here.
TEST(Mpi, PipelineMicroBatchesGiveTheOneProcessLogits) {
  DSA_NEED_MPI();
  for_every_case([](const std::string& name, const Case& c) {
    const SafeTensors a = SafeTensors::open(one_process_logits(name + "_mb_one", c));
    for (const auto& [np, layout] : {std::pair{2, "--pp 2"}, std::pair{2, "--pp 2 --micro-batches 3"}, std::pair{4, "--pp 2 --ep 2"},
                                     std::pair{4, "--pp 2 --tp 2"}}) {
      SCOPED_TRACE(layout);
      const std::string out = test::scratch(name + "_mb.safetensors");
      const auto r2 = test::shell(mpirun(np) + test::dsa_binary() + " logits" + c.args + " " + layout + " --batch-with 8 --out " + out + " 2>&1");
      ASSERT_EQ(r2.code, 0) << r2.out;
      const SafeTensors b = SafeTensors::open(out);
      for (const std::string t : {"logits", "mtp.logits"}) {
        if (t == "mtp.logits" && !c.mtp) continue;
        EXPECT_LE(rel_err(floats(b, t), floats(a, t)), kOneProcessBound) << t;
      }
    }
  });
}

TEST(Mpi, GreedyRunGivesTheOneProcessIds) {
  DSA_NEED_MPI();
  for_every_case([](const std::string&, const Case& c) {
    const std::string run = " run --model " + c.dir + "/model --ids " + c.ids + " --print-ids -n 6 --greedy --ignore-eos" + (c.mtp ? " --mtp" : "");
    const auto r1 = test::shell(test::dsa_binary() + run + " 2>/dev/null");
    ASSERT_EQ(r1.code, 0);
    EXPECT_FALSE(r1.out.empty());
    for (const std::string layout : kLayouts) {
      const auto r2 = test::shell(mpirun(2) + test::dsa_binary() + run + " " + layout + " 2>/dev/null");
      ASSERT_EQ(r2.code, 0) << layout;
      EXPECT_EQ(r2.out, r1.out) << layout << ": rank 0 prints the ids once, the other rank nothing";
    }
  });
}

// Data-parallel attention with several sequences: `dsa run --prompts` adds them all at once,
// so the ranks take turns owning them, each attends for its own, and every MoE layer mixes
// the ranks' tokens (gathered, or sent all-to-all to their experts' ranks); every prompt's
// greedy ids are the single-process ones.
TEST(Mpi, DataParallelAttentionRunsEachRanksOwnSequences) {
  DSA_NEED_MPI();
  const std::string prompts = test::scratch("dp_prompts.txt");
  {
    std::ofstream f(prompts);
    f << "1,2,3,4,5,6,7\n9,8,7,6\n3,3,3,3,3,3,3,3,3,3,3\n5,4\n12,30,7,7,1\n";
  }
  for_every_case([&](const std::string&, const Case& c) {
    const std::string run = " run --model " + c.dir + "/model --prompts " + prompts + " --print-ids -n 8 --greedy --ignore-eos";
    const auto r1 = test::shell(test::dsa_binary() + run + " 2>/dev/null");
    ASSERT_EQ(r1.code, 0);
    ASSERT_EQ(std::count(r1.out.begin(), r1.out.end(), '\n'), 5) << r1.out;
    // stdout alone: rank 0 prints the ids; both ranks' stderr would interleave with them.
    // Both ways of moving tokens to the experts' ranks, on two ranks and on four.
    const std::string log = test::scratch("dp_run.log");
    // And two pipeline stages of two data-parallel ranks each.
    for (const auto& [np, dispatch, layout] : {std::tuple{2, "allgather", "--ep 2 --dp"}, std::tuple{2, "alltoall", "--ep 2 --dp"},
                                               std::tuple{4, "alltoall", "--ep 4 --dp"}, std::tuple{4, "auto", "--pp 2 --ep 2 --dp"}}) {
      SCOPED_TRACE(std::string(layout) + ", " + dispatch);
      const auto r2 = test::shell(mpirun(np) + "-x DSA_MOE_DISPATCH=" + dispatch + " " + test::dsa_binary() + run + " " + layout + " 2>" + log);
      ASSERT_EQ(r2.code, 0) << test::shell("cat " + log).out;
      EXPECT_EQ(r2.out, r1.out) << "every prompt's ids as one process";
    }
  });
  const auto bad = test::shell(mpirun(2) + test::dsa_binary() + " run --model " + test::tiny_model_dir() + " --ids 1,2 --print-ids -n 1 --tp 2 --dp 2>&1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--dp"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("needs --ep > 1"), std::string::npos) << bad.out;
}

TEST(Mpi, LayoutsThatDoNotFitAreOneClearError) {
  DSA_NEED_MPI();
  const auto cases = test::golden_cases();
  ASSERT_FALSE(cases.empty());
  const Case c = read_case(cases.front());
  const std::string out = test::scratch("layout.safetensors");
  const std::string logits = test::dsa_binary() + " logits" + c.args + " --out " + out;
  // Not under mpirun.
  auto r = test::shell(logits + " --ep 2 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("mpirun -np 2"), std::string::npos) << r.out;
  // Two processes without a layout, and a layout for another job size.
  r = test::shell(mpirun(2) + logits + " 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--ep 2"), std::string::npos) << r.out;
  r = test::shell(mpirun(2) + logits + " --ep 4 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("the job has 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank "), std::string::npos) << "the error names the rank: " << r.out;
  r = test::shell(mpirun(2) + logits + " --pp 2 --tp 2 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("expected 4 processes"), std::string::npos) << r.out;
  r = test::shell(mpirun(2) + logits + " --ep 2 --tp 4 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--ep and --tp are 1 or equal"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out)) << "nothing written";
}

// A job size that does not divide the config's `field` (the first golden case's), asked for
// with `flag`: refused before loading, naming what it does not divide.
void refused_when_uneven(const std::string& field, const std::string& flag, const std::string& what) {
  const auto cases = test::golden_cases();
  ASSERT_FALSE(cases.empty());
  const Case c = read_case(cases.front());
  std::ifstream in(c.dir + "/model/config.json");
  const int count = nlohmann::json::parse(in).value(field, 0);
  ASSERT_GT(count, 1) << field;
  int np = 2;
  while (count % np == 0) ++np;  // a job size that does not divide it
  ASSERT_LE(np, 8) << "test needs a small non-divisor of " << count;
  const auto r = test::shell(mpirun(np) + test::dsa_binary() + " logits" + c.args + " " + flag + " " + std::to_string(np) + " --out " +
                             test::scratch("uneven.safetensors") + " 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("does not divide the model's " + std::to_string(count) + " " + what), std::string::npos) << r.out;
}

TEST(Mpi, ExpertsOrHeadsThatDoNotSplitEvenlyAreRefusedBeforeLoading) {
  DSA_NEED_MPI();
  refused_when_uneven("n_routed_experts", "--ep", "routed experts");
  refused_when_uneven("num_attention_heads", "--tp", "attention heads");
}

// `dsa bench comm`: one point per requested size, its bytes those of tokens x hidden floats.
TEST(Mpi, BenchCommTimesEachCollectiveAtEachSize) {
  DSA_NEED_MPI();
  for (const std::string coll : {"allreduce", "allgather", "send", "broadcast", "alltoall"}) {
    SCOPED_TRACE(coll);
    const auto r = test::shell(mpirun(2) + test::dsa_binary() + " bench comm --collective " + coll + " --hidden 96 --tokens 1,16 --repeat 5 --json 2>&1");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);  // rank 0 alone prints
    EXPECT_EQ(j.at("ranks"), 2);
    EXPECT_EQ(j.at("nodes"), 1);
    EXPECT_EQ(j.at("collective"), coll);
    ASSERT_EQ(j.at("points").size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& p = j["points"][i];
      EXPECT_EQ(p.at("bytes").get<size_t>(), size_t(i == 0 ? 1 : 16) * 96 * 4);
      EXPECT_GT(p.at("median_us").get<double>(), 0.0);
      EXPECT_GE(p.at("p90_us").get<double>(), p.at("median_us").get<double>());
    }
  }
  const auto bad = test::shell(test::dsa_binary() + " bench comm --collective gather 2>&1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("expected allreduce"), std::string::npos) << bad.out;
  const auto one = test::shell(test::dsa_binary() + " bench comm 2>&1");
  EXPECT_NE(one.code, 0);
  EXPECT_NE(one.out.find("mpirun -np N"), std::string::npos) << one.out;
}

// `dsa serve` started by `command` (stderr to `log`), until stop(): its port and the pid to
// signal (rank 0 under mpirun, which prints it).
struct Served {
  pid_t pid = 0, signal_pid = 0;
  int port = 0;
  Served(const std::string& command, const std::string& log) {
    std::filesystem::remove(log);  // a previous server's log would give its port and pid
    const std::string cmd = "exec " + command + " 2>" + log;
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    if (::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0) return;
    signal_pid = pid;
    // Under mpirun rank 0's pid line and the address line come through mpirun's forwarding
    // in either order: wait for both, or the drain would signal mpirun itself.
    const bool ranks = command.find("mpirun") != std::string::npos;
    for (int i = 0; i < 1200 && (!port || (ranks && signal_pid == pid)); ++i) {
      std::ifstream in(log);
      const std::string s((std::istreambuf_iterator<char>(in)), {});
      std::smatch m;
      if (std::regex_search(s, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) port = std::stoi(m[1].str());
      if (std::regex_search(s, m, std::regex(R"(rank 0 is pid (\d+))"))) signal_pid = pid_t(std::stoi(m[1].str()));
      if (!port || (ranks && signal_pid == pid)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Greedy ids of an id prompt (models without a tokenizer).
  std::string completion_ids(const std::vector<int>& prompt = {1, 2, 3, 4, 5}) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return "(no reply)";
    return nlohmann::json::parse(r->body)["choices"][0]["token_ids"].dump();
  }
  std::string chat() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "hello there, how are you?"}}}},
                                 {"max_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return "(no reply)";
    return nlohmann::json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
  }
  int stop() const {  // the exit status after SIGTERM (a drain), -1 if it did not end within a minute
    ::kill(signal_pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600; ++i) {
      if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);  // the `timeout` wrapping mpirun, which then ends the job
    ::waitpid(pid, &st, 0);
    return -1;
  }
};

// A chat served under mpirun in each layout: rank 0 serves and its engine's calls run on the
// other rank too; the reply is the single-process one, and SIGTERM to rank 0 drains the job.
TEST(Mpi, ServeUnderMpirunRepliesAsOneProcess) {
  DSA_NEED_MPI();
  const std::string serve = test::dsa_binary() + " serve --model " + test::tiny_model_dir() + " --port 0 --ctx 512";
  Served one(serve, test::scratch("serve_one.log"));
  ASSERT_GT(one.port, 0);
  const std::string want = one.chat();
  EXPECT_EQ(one.stop(), 0);
  ASSERT_NE(want, "(no reply)");
  for (const std::string layout : kLayouts) {
    SCOPED_TRACE(layout);
    const std::string log = test::scratch("serve_" + layout_tag(layout) + ".log");
    Served job(mpirun(2) + serve + " " + layout, log);
    ASSERT_GT(job.port, 0);
    EXPECT_NE(job.signal_pid, job.pid) << "rank 0's pid is in the log";
    const std::string got = job.chat();
    EXPECT_EQ(got, want);
    EXPECT_EQ(job.chat(), want) << "again, from the prefix cache";
    std::printf("[ mpi ] serve %s: %zu bytes of reply, as one process: %s\n", layout.c_str(), got.size(), got == want ? "yes" : "no");
    EXPECT_EQ(job.stop(), 0) << "the drain ends every rank";
  }
}

// Speculative decoding served under mpirun: the MTP layer on the last stage, its inputs
// broadcast from there, and the drafts verified on every rank alike.
TEST(Mpi, ServeWithMtpUnderMpirunGivesTheOneProcessIds) {
  DSA_NEED_MPI();
  std::string dir;
  for (const auto& name : test::golden_cases())
    if (dir.empty() && read_case(name).mtp) dir = read_case(name).dir + "/model";
  ASSERT_FALSE(dir.empty()) << "no golden case with an MTP layer";
  const std::string serve = test::dsa_binary() + " serve --model " + dir + " --port 0 --ctx 256 --mtp";
  Served one(serve, test::scratch("serve_mtp_one.log"));
  ASSERT_GT(one.port, 0);
  const std::string want = one.completion_ids();
  EXPECT_EQ(one.stop(), 0);
  ASSERT_NE(want, "(no reply)");
  // Three requests at once for data-parallel attention: the ranks own different ones.
  const std::vector<std::vector<int>> prompts = {{1, 2, 3, 4, 5}, {7, 6, 5}, {2, 4, 6, 8, 10, 12}};
  auto concurrently = [&](const Served& s) {
    std::vector<std::string> ids(prompts.size());
    std::vector<std::thread> t;
    for (size_t i = 0; i < prompts.size(); ++i) t.emplace_back([&, i] { ids[i] = s.completion_ids(prompts[i]); });
    for (auto& th : t) th.join();
    return ids;
  };
  Served one_c(serve, test::scratch("serve_mtp_one_c.log"));
  ASSERT_GT(one_c.port, 0);
  const auto want_c = concurrently(one_c);
  EXPECT_EQ(one_c.stop(), 0);
  for (const std::string layout : {"--pp 2", "--tp 2", "--ep 2 --dp"}) {
    SCOPED_TRACE(layout);
    Served job(mpirun(2) + serve + " " + layout, test::scratch("serve_mtp_" + layout_tag(layout) + ".log"));
    ASSERT_GT(job.port, 0);
    EXPECT_EQ(job.completion_ids(), want);
    if (layout == "--ep 2 --dp") {
      EXPECT_EQ(concurrently(job), want_c);
    }
    EXPECT_EQ(job.stop(), 0);
  }
}

// A rank killed mid-run: mpirun ends the job and names it; nothing waits forever.
TEST(Mpi, AKilledRankEndsTheJob) {
  DSA_NEED_MPI();
  const auto cases = test::golden_cases();
  ASSERT_FALSE(cases.empty());
  const Case c = read_case(cases.front());
  const std::string run = test::dsa_binary() + " run --model " + c.dir + "/model --ids " + c.ids +
                          " --print-ids -n 1000000 --ctx 4096 --ignore-eos --ep 2";
  // On rank 1 a background shell kills the command (exec'd in its place) after a second.
  const std::string wrapper = "sh -c '[ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && (sleep 1; kill -9 $$) & exec " + run + " >/dev/null'";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = test::shell(mpirun(2) + wrapper + " 2>&1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung until the timeout: " << r.out;
  EXPECT_LT(s, 120) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << "the message names the rank: " << r.out;
}

}  // namespace

namespace {

// A rank that hangs alive (stopped here): the other's collective gives up after
// DSA_COMM_TIMEOUT seconds with one clear error, and the job ends instead of waiting forever.
TEST(Mpi, AHungRankEndsTheJobAfterTheTimeout) {
  DSA_NEED_MPI();
  const auto cases = test::golden_cases();
  ASSERT_FALSE(cases.empty());
  const Case c = read_case(cases.front());
  const std::string run = test::dsa_binary() + " run --model " + c.dir + "/model --ids " + c.ids +
                          " --print-ids -n 1000000 --ctx 4096 --ignore-eos --tp 2";
  const std::string wrapper = "sh -c '[ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && (sleep 1; kill -STOP $$) & exec " + run + " >/dev/null'";
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = test::shell("DSA_COMM_TIMEOUT=3 " + mpirun(2) + "-x DSA_COMM_TIMEOUT " + wrapper + " 2>&1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung until the timeout: " << r.out;
  EXPECT_LT(s, 120) << r.out;
  EXPECT_NE(r.out.find("waited 3 s for the other ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0 of 2"), std::string::npos) << "the message names the rank: " << r.out;
}

}  // namespace
