// scripts/dsv41.sh against two local processes: the fake binary (tests/runtime/fake_dsv41_serve.sh)
// plays both ranks; DSV41_REMOTE=local replaces ssh, and one test runs the ssh path through a fake
// `ssh` that executes the remote command locally. `fabric --env` comes from the real binary.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct Result {
  int rc;
  std::string out;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

bool process_alive(long pid) {
  if (pid <= 0 || ::kill(pid_t(pid), 0) != 0) return false;
  std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
  auto p = stat.rfind(')');
  return p != std::string::npos && p + 2 < stat.size() && stat[p + 2] != 'Z';
}

long read_pid(const fs::path& p) {
  std::string s = slurp(p);
  return s.empty() ? -1 : std::stol(s);
}

class Launcher : public ::testing::Test {
 protected:
  fs::path dir, logs, state, bin;
  int port = 0;
  std::string extra_env;  // extra "K=V" lines for the env file

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() / fmt::format("dsv41_launcher_{}_{}", info->name(), ::getpid());
    fs::remove_all(dir);
    logs = dir / "logs";
    state = dir / "state";
    bin = dir / "bin";
    fs::create_directories(dir / "model");
    fs::create_directories(state);
    fs::create_directories(bin);
    std::ofstream(dir / "model" / "config.json") << "{}\n";
    port = free_port();
  }

  void TearDown() override {
    run("stop");  // never leave processes behind, whatever failed
    fs::remove_all(dir);
  }

  void write_env(const std::string& remote = "local") {
    std::ofstream f(dir / "test.env");
    f << "# launcher test configuration\n"
      << "DSV41_REMOTE=" << remote << "\n"
      << "DSV41_WORKER_HOST=op@worker-1\n"
      << "DSV41_WORKER_ADDR=127.0.0.1\n"
      << "DSV41_BIN=" << DSV41_SOURCE_DIR << "/tests/runtime/fake_dsv41_serve.sh\n"
      << "DSV41_LOG_DIR=" << logs.string() << "\n"
      << "DSV41_HOST=127.0.0.1\n"
      << "DSV41_PORT=" << port << "\n"
      << "DSV41_MODEL=" << (dir / "model").string() << "\n"
      << "DSV41_MASTER_ADDR=127.0.0.1\n"
      << "DSV41_MASTER_PORT=29777\n"
      << "DSV41_START_TIMEOUT_S=20\n"
      << "DSV41_STOP_TIMEOUT_S=5\n"
      << "DSV41_SSH_OPTS='-o BatchMode=yes'\n"
      << extra_env;
  }

  Result run(const std::string& args, const std::string& env = "") {
    std::string cmd = fmt::format(
        "cd {} && env DSV41_ENV={} FAKE_STATE_DIR={} FAKE_REAL_BIN={} PATH={}:$PATH {} bash {}/scripts/dsv41.sh {} 2>&1",
        dir.string(), (dir / "test.env").string(), state.string(), DSV41_BINARY, bin.string(), env, DSV41_SOURCE_DIR,
        args);
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    int st = ::pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
  }

  long pid_of(int rank) { return read_pid(logs / fmt::format("rank{}.pid", rank)); }

  // A fake `ssh` on PATH: logs its arguments and runs the remote command here.
  void install_fake_ssh() {
    fs::path p = bin / "ssh";
    std::ofstream(p) << "#!/usr/bin/env bash\n"
                        "printf '%s\\n' \"$*\" >> \"" << (state / "ssh.log").string() << "\"\n"
                        "while [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\n"
                        "shift; host=$1; shift\n"
                        "[ \"$host\" = op@worker-1 ] || { echo \"fake ssh: unexpected host $host\" >&2; exit 255; }\n"
                        "exec bash -c \"$*\"\n";
    fs::permissions(p, fs::perms::owner_all);
  }
};

}  // namespace

TEST_F(Launcher, StartStatusLogsStopTwoLocalRanks) {
  write_env();
  Result s = run("start");
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("rank 1 started on local"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("healthy after"), std::string::npos) << s.out;
  long p0 = pid_of(0), p1 = pid_of(1);
  ASSERT_TRUE(process_alive(p0)) << s.out;
  ASSERT_TRUE(process_alive(p1)) << s.out;
  EXPECT_NE(p0, p1);

  // The worker got the bare worker form; rank 0 the config file plus explicit flags.
  std::string a1 = slurp(state / "rank1.args");
  EXPECT_NE(a1.find(fmt::format("--rank\n1\n--world-size\n2\n--model\n{}\n--master-addr\n127.0.0.1\n--master-port\n29777\n",
                                (dir / "model").string())),
            std::string::npos)
      << a1;
  std::string a0 = slurp(state / "rank0.args");
  EXPECT_NE(a0.find("--rank\n0\n--world-size\n2\n--config\n" + (dir / "test.env").string()), std::string::npos) << a0;
  EXPECT_NE(a0.find(fmt::format("--port\n{}\n", port)), std::string::npos) << a0;
  // Both ranks run with the environment `dsv41-serve fabric --env` chose on their host.
  for (int r : {0, 1}) {
    std::string env = slurp(state / fmt::format("rank{}.env", r));
    EXPECT_NE(env.find("NCCL_IB_DISABLE="), std::string::npos) << "rank " << r << ": " << env;
  }

  Result st = run("status");
  EXPECT_EQ(st.rc, 0) << st.out;
  EXPECT_NE(st.out.find(fmt::format("rank 0: running (pid {})", p0)), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("{\"status\":\"ok\",\"rank\":0}"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find(fmt::format("rank 1 (local): running (pid {})", p1)), std::string::npos) << st.out;

  Result lw = run("logs worker -n 5");
  EXPECT_EQ(lw.rc, 0);
  EXPECT_NE(lw.out.find("fake rank 1 ready"), std::string::npos) << lw.out;
  Result l0 = run("logs");
  EXPECT_NE(l0.out.find("fake rank 0 ready"), std::string::npos) << l0.out;

  // Starting again changes nothing.
  Result again = run("start");
  EXPECT_EQ(again.rc, 0) << again.out;
  EXPECT_NE(again.out.find("already running"), std::string::npos) << again.out;
  EXPECT_EQ(pid_of(0), p0);
  EXPECT_EQ(pid_of(1), p1);

  Result stop = run("stop");
  EXPECT_EQ(stop.rc, 0) << stop.out;
  EXPECT_NE(stop.out.find(fmt::format("rank 0: stopped {}", p0)), std::string::npos) << stop.out;
  EXPECT_FALSE(process_alive(p0));
  EXPECT_FALSE(process_alive(p1));
  EXPECT_FALSE(fs::exists(logs / "rank0.pid"));
  // Graceful: both got SIGTERM and exited by themselves.
  EXPECT_NE(slurp(logs / "rank0.log").find("fake rank 0: SIGTERM, exiting"), std::string::npos);
  EXPECT_NE(slurp(logs / "rank1.log").find("fake rank 1: SIGTERM, exiting"), std::string::npos);

  Result down = run("status");
  EXPECT_EQ(down.rc, 3) << down.out;
  EXPECT_NE(down.out.find("rank 0: stopped"), std::string::npos) << down.out;
  EXPECT_NE(down.out.find("rank 1 (local): stopped"), std::string::npos) << down.out;
}

TEST_F(Launcher, RestartWorkerKeepsTheHead) {
  write_env();
  ASSERT_EQ(run("start").rc, 0);
  long p0 = pid_of(0), p1 = pid_of(1);
  Result r = run("restart worker");
  ASSERT_EQ(r.rc, 0) << r.out;
  long q1 = pid_of(1);
  EXPECT_NE(q1, p1);
  EXPECT_TRUE(process_alive(q1));
  EXPECT_FALSE(process_alive(p1));
  EXPECT_EQ(pid_of(0), p0);
  EXPECT_TRUE(process_alive(p0));
  // A worker killed from outside shows up as not running; `start worker` brings it back.
  ::kill(pid_t(q1), SIGKILL);
  for (int i = 0; i < 100 && process_alive(q1); ++i) std::this_thread::sleep_for(20ms);
  Result st = run("status");
  EXPECT_EQ(st.rc, 3) << st.out;
  EXPECT_NE(st.out.find("rank 1 (local): not running (stale pid file"), std::string::npos) << st.out;
  Result sw = run("start worker");
  EXPECT_EQ(sw.rc, 0) << sw.out;
  EXPECT_TRUE(process_alive(pid_of(1)));
  EXPECT_EQ(run("status").rc, 0);
}

TEST_F(Launcher, WorkerThatCannotStartIsReportedAndNothingIsLeftRunning) {
  write_env();
  Result s = run("start", "FAKE_FAIL_RANK=1");
  EXPECT_NE(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("rank 1 on local exited right after start"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("cannot load the model"), std::string::npos) << "the log tail is shown: " << s.out;
  EXPECT_FALSE(fs::exists(state / "rank0.args")) << "rank 0 must not start without its worker";
}

TEST_F(Launcher, HeadThatDiesBeforeHealthStopsTheWorkerToo) {
  write_env();
  Result s = run("start", "FAKE_FAIL_RANK=0");
  EXPECT_NE(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("start failed; both ranks stopped"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("rank0.log: fake rank 0: error: cannot load the model"), std::string::npos) << s.out;
  long p1 = read_pid(logs / "rank1.pid");
  EXPECT_EQ(p1, -1) << "worker pid file left behind";
  EXPECT_NE(slurp(logs / "rank1.log").find("fake rank 1: SIGTERM, exiting"), std::string::npos);
}

TEST_F(Launcher, WaitsForASlowHead) {
  write_env();
  Result s = run("start", "FAKE_START_DELAY=2");
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("healthy after"), std::string::npos);
  EXPECT_EQ(s.out.find("healthy after 0 s"), std::string::npos) << "reported healthy before the server was up";
}

TEST_F(Launcher, SshModeQuotesTheRemoteCommands) {
  install_fake_ssh();
  write_env("ssh");
  Result s = run("start");
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("rank 1 started on op@worker-1"), std::string::npos) << s.out;
  std::string ssh_log = slurp(state / "ssh.log");
  EXPECT_NE(ssh_log.find("-o BatchMode=yes -- op@worker-1 bash -c"), std::string::npos) << ssh_log;
  Result st = run("status worker");
  EXPECT_EQ(st.rc, 0) << st.out;
  EXPECT_NE(st.out.find("rank 1 (op@worker-1): running"), std::string::npos) << st.out;
  EXPECT_EQ(st.out.find("rank 0"), std::string::npos) << "status worker shows only the worker";
  Result stop = run("stop");
  EXPECT_EQ(stop.rc, 0) << stop.out;
  EXPECT_NE(stop.out.find("rank 1 (op@worker-1): stopped"), std::string::npos) << stop.out;
}

TEST_F(Launcher, SyncUsesResumableRsyncToTheWorker) {
  fs::path rsync_log = state / "rsync.log";
  std::ofstream(bin / "rsync") << "#!/usr/bin/env bash\nprintf '%s|' \"$@\" >> " << rsync_log.string()
                               << "\necho >> " << rsync_log.string() << "\n";
  fs::permissions(bin / "rsync", fs::perms::owner_all);
  install_fake_ssh();
  fs::create_directories(dir / "engram");
  extra_env = fmt::format("DSV41_ENGRAM_DIR={}\nDSV41_WORKER_MODEL='{}'\n", (dir / "engram").string(),
                          (dir / "w model").string());
  write_env("ssh");
  Result s = run("sync");
  ASSERT_EQ(s.rc, 0) << s.out;
  std::string log = slurp(rsync_log);
  std::string model_line = fmt::format("-a|--partial|--append-verify|--human-readable|--info=progress2|-e|ssh -o "
                                       "BatchMode=yes|{}/|op@worker-1:{}/|",
                                       (dir / "model").string(), (dir / "w model").string());
  EXPECT_NE(log.find(model_line), std::string::npos) << log;
  EXPECT_NE(log.find(fmt::format("{}/|op@worker-1:{}/|", (dir / "engram").string(), (dir / "engram").string())),
            std::string::npos)
      << log;
  // The destination folder was created on the worker first (through ssh, with the space quoted).
  EXPECT_TRUE(fs::is_directory(dir / "w model"));
  fs::remove(bin / "rsync");
  fs::remove_all(dir / "w model");
}

TEST_F(Launcher, SingleRankDeploymentHasNoWorker) {
  extra_env = "DSV41_WORLD_SIZE=1\n";
  write_env();
  Result s = run("start");
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_FALSE(fs::exists(state / "rank1.args"));
  EXPECT_NE(slurp(state / "rank0.args").find("--world-size\n1\n"), std::string::npos);
  Result st = run("status");
  EXPECT_EQ(st.rc, 0) << st.out;
  EXPECT_EQ(st.out.find("rank 1"), std::string::npos) << st.out;
  Result w = run("start worker");
  EXPECT_EQ(w.rc, 1);
  EXPECT_NE(w.out.find("there is no worker"), std::string::npos) << w.out;
  EXPECT_EQ(run("stop").rc, 0);
  EXPECT_FALSE(process_alive(read_pid(logs / "rank0.pid")));
}

TEST_F(Launcher, ClearErrorsForBadConfiguration) {
  Result none = run("status");
  EXPECT_EQ(none.rc, 1);
  EXPECT_NE(none.out.find("no configuration file"), std::string::npos) << none.out;
  extra_env = "DSV41_REMOTE=carrier-pigeon\n";
  write_env();
  Result bad = run("status");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.out.find("DSV41_REMOTE must be ssh or local"), std::string::npos) << bad.out;
  Result unk = run("frobnicate");
  EXPECT_NE(unk.rc, 0);
  EXPECT_NE(unk.out.find("unknown command"), std::string::npos) << unk.out;
}
