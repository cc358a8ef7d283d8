#include "compass-runner/state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "compass-runner/backend.h"

namespace runner {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/runner-state-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string createError(const std::string& root, const std::string& id) {
  try {
    createStateDir(root, id);
  } catch (const RunnerError& e) {
    return e.what();
  }
  return "";
}

mode_t modeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(AgentIdTest, ShapeAndUniqueness) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = newAgentId();
    EXPECT_TRUE(isAgentId(id)) << id;
    EXPECT_TRUE(seen.insert(id).second) << id;
  }
  for (const char* bad : {"", "a", "a012345678", "a0123456789a", "b0123456789", "a0123456789A",
                          "a01234567g9", "../a012345", "A0123456789"}) {
    EXPECT_FALSE(isAgentId(bad)) << bad;
  }
}

TEST(StateRootTest, HostUsesTmpdirOthersUseCompassStateDir) {
  {
    ScopedEnv tmp("TMPDIR", "/private/tmp");
    EXPECT_EQ(stateRoot("host"), "/private/tmp/compass-host");
  }
  {
    ScopedEnv tmp("TMPDIR", nullptr);
    EXPECT_EQ(stateRoot("host"), "/tmp/compass-host");
  }
  {
    ScopedEnv tmp("TMPDIR", "");
    EXPECT_EQ(stateRoot("host"), "/tmp/compass-host");
  }
  {
    ScopedEnv dir("COMPASS_STATE_DIR", nullptr);
    EXPECT_EQ(stateRoot("podman"), "/run/compass-runner");
  }
  ScopedEnv dir("COMPASS_STATE_DIR", "/var/lib/x");
  EXPECT_EQ(stateRoot("podman"), "/var/lib/x");
  EXPECT_EQ(stateRoot("microvm"), "/var/lib/x");
}

// A relative root was made below the caller's working directory (`image build`, podman's
// containers.conf); every command refuses it, naming the variable.
TEST(StateRootTest, ARelativeOrControlByteRootIsRefusedNamingTheVariable) {
  const auto error = [](const std::string& tier) {
    try {
      (void)stateRoot(tier);
    } catch (const RunnerError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  {
    ScopedEnv dir("COMPASS_STATE_DIR", "relative/state");
    EXPECT_NE(error("podman").find("COMPASS_STATE_DIR must be absolute"), std::string::npos);
    EXPECT_NE(error("microvm").find("COMPASS_STATE_DIR must be absolute"), std::string::npos);
  }
  {
    ScopedEnv dir("COMPASS_STATE_DIR", "/tmp/a\nb");
    EXPECT_NE(error("podman").find("COMPASS_STATE_DIR must not hold control"), std::string::npos);
  }
  ScopedEnv tmp("TMPDIR", "tmp");
  EXPECT_NE(error("host").find("TMPDIR must be absolute"), std::string::npos);
}

TEST(StateRootTest, ARootTooLongForTheAgentsSocketsIsRefused) {
  const std::string fits = "/" + std::string(kMaxStateRootBytes - 1, 'x');
  EXPECT_NO_THROW(checkStateRoot(fits, true));
  EXPECT_THROW(checkStateRoot(fits + "x", true), RunnerError);
  EXPECT_NO_THROW(checkStateRoot(fits + "x", false));  // the host tier binds no socket
}

TEST(StateRootTest, AColonOrBytesThatAreNotUtf8AreRefusedWhereTheDirIsMounted) {
  for (const char* bad :
       {"/tmp/c:d", "/tmp/\xff", "/tmp/\xc0\xaf", "/tmp/\xed\xa0\x80", "/tmp/\xe2\x82"}) {
    EXPECT_THROW(checkStateRoot(bad, true), RunnerError) << bad;
    EXPECT_NO_THROW(checkStateRoot(bad, false)) << bad;  // host tier: nothing mounted
  }
  EXPECT_NO_THROW(checkStateRoot("/tmp/\xc3\xa9t\xc3\xa9/\xf0\x9f\x93\xa6", true));
}

TEST(CreateStateDirTest, MakesRootAndDirPrivate) {
  TempDir tmp;
  const std::string root = tmp.path() + "/compass-host";
  const std::string id = newAgentId();
  const std::string dir = createStateDir(root, id);
  EXPECT_EQ(dir, root + "/" + id);
  EXPECT_EQ(modeOf(root), 0700U);
  EXPECT_EQ(modeOf(dir), 0700U);
  // A second agent under the same root is fine; the same id twice is not.
  EXPECT_NO_THROW(createStateDir(root, newAgentId()));
  EXPECT_NE(createError(root, id).find("File exists"), std::string::npos);
}

TEST(CreateStateDirTest, RefusesASymlinkRoot) {
  TempDir tmp;
  const std::string real = tmp.path() + "/real";
  fs::create_directory(real);
  fs::permissions(real, fs::perms::owner_all, fs::perm_options::replace);
  const std::string link = tmp.path() + "/compass-host";
  fs::create_directory_symlink(real, link);
  const std::string why = createError(link, newAgentId());
  EXPECT_NE(why.find("is a symlink"), std::string::npos) << why;
  EXPECT_TRUE(fs::is_empty(real));
}

TEST(CreateStateDirTest, RefusesAGroupOrWorldWritableRoot) {
  TempDir tmp;
  for (mode_t mode : {01777, 0770, 0702}) {
    const std::string root = tmp.path() + "/root" + std::to_string(mode);
    ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(root.c_str(), mode), 0);
    const std::string why = createError(root, newAgentId());
    EXPECT_NE(why.find("group- or world-writable"), std::string::npos) << why;
    EXPECT_TRUE(fs::is_empty(root));
  }
}

TEST(CreateStateDirTest, RefusesARootOwnedBySomeoneElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  TempDir tmp;
  const std::string root = tmp.path() + "/compass-host";
  ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
  ASSERT_EQ(::chown(root.c_str(), 65534, 65534), 0);
  const std::string why = createError(root, newAgentId());
  EXPECT_NE(why.find("owned by uid 65534"), std::string::npos) << why;
  EXPECT_NE(why.find("TMPDIR"), std::string::npos) << why;
}

TEST(CreateStateDirTest, RefusesRelativeRootsBadIdsAndMissingParents) {
  EXPECT_NE(createError("tmp/compass-host", newAgentId()).find("absolute"), std::string::npos);
  TempDir tmp;
  EXPECT_NE(createError(tmp.path() + "/x", "../etc").find("not an agent id"), std::string::npos);
  EXPECT_NE(createError(tmp.path() + "/missing/compass-host", newAgentId())
                .find("cannot create state root"),
            std::string::npos);
  // A newline would make the root two lines of /run/compass-roots (another root's gc would
  // then not know this one's agents).
  EXPECT_NE(createError(tmp.path() + "/a\n/b", newAgentId()).find("control characters"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp.path() + "/a\n"));
}

AgentRecord sampleRecord(const std::string& dir, const std::string& id) {
  AgentRecord rec;
  rec.id = id;
  rec.tier = "host";
  rec.posture = "unenforced";
  rec.agent_id = "researcher-1.example";
  rec.runner_pid = ::getpid();
  rec.runner_starttime = processStartTime(::getpid());
  rec.pid = 1234;
  rec.started_unix_ms = 1700000000123;
  rec.state_dir = dir;
  rec.metrics_addr = "127.0.0.1:9600";
  rec.container = "compass-" + id;
  rec.netns = "compass-" + id;
  rec.veth = "cv" + id;
  rec.sam_box_pid = 99;
  rec.command = {"sh", "-c", "echo \"quoted\""};
  return rec;
}

TEST(RecordTest, RoundTripsThroughAgentJson) {
  TempDir tmp;
  const std::string id = newAgentId();
  const std::string dir = createStateDir(tmp.path() + "/root", id);
  const AgentRecord rec = sampleRecord(dir, id);
  writeRecord(rec);
  EXPECT_EQ(modeOf(dir + "/agent.json"), 0600U);
  EXPECT_FALSE(fs::exists(dir + "/agent.json.tmp"));
  const auto back = readRecord(dir);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(recordText(*back), recordText(rec));
  EXPECT_EQ(back->command, rec.command);
  EXPECT_EQ(back->runner_starttime, rec.runner_starttime);
}

TEST(RecordTest, BadRecordsAreRefusedNamingTheKey) {
  EXPECT_THROW(parseRecord("not json"), RunnerError);
  EXPECT_THROW(parseRecord("[]"), RunnerError);
  try {
    parseRecord(R"({"id":"a0123456789","tier":"host","posture":"unenforced"})");
    FAIL();
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("runner_pid"), std::string::npos) << e.what();
  }
  try {
    parseRecord(R"({"id":"a0123456789","tier":"host","posture":"unenforced","runner_pid":"x",)"
                R"("runner_starttime":1,"state_dir":"/x"})");
    FAIL();
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("runner_pid"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parseRecord(R"({"id":"../../etc","tier":"host","posture":"unenforced",)"
                           R"("runner_pid":1,"runner_starttime":1,"state_dir":"/x"})"),
               RunnerError);
}

TEST(RecordTest, ReadRecordsTrustsWhereARecordLiesNotWhatItSays) {
  TempDir tmp;
  ScopedEnv env("TMPDIR", tmp.path().c_str());
  const std::string root = stateRoot("host");
  const std::string id = newAgentId();
  const std::string dir = createStateDir(root, id);
  AgentRecord rec = sampleRecord("/home/someone-else", id);  // a forged state_dir
  rec.state_dir = dir;
  writeRecord(rec);
  // Edit the file as an agent could: point state_dir elsewhere.
  std::string text = recordText(rec);
  text.replace(text.find(dir), dir.size(), "/home/someone-else");
  std::ofstream(dir + "/agent.json") << text;

  const std::string forged_id = newAgentId();
  const std::string forged_dir = createStateDir(root, forged_id);
  AgentRecord podman = sampleRecord(forged_dir, forged_id);
  podman.tier = "podman";  // a host-root record may not claim another tier
  writeRecord(podman);
  const std::string mismatched = createStateDir(root, newAgentId());
  writeRecord(sampleRecord(mismatched, newAgentId()));  // id differs from its directory

  std::vector<AgentRecord> found;
  for (auto& r : readRecords()) {
    if (r.state_dir.rfind(root, 0) == 0) found.push_back(r);
  }
  ASSERT_EQ(found.size(), 1U);
  EXPECT_EQ(found[0].id, id);
  EXPECT_EQ(found[0].state_dir, dir);
}

TEST(RecordTest, TheCommandIsKeptWithinItsBoundAndAnyBytesAreWritten) {
  // A prompt in argv can be megabytes; a record over the 1 MiB read cap would read as none.
  const std::vector<std::string> small = {"sh", "-c", "echo hi"};
  EXPECT_EQ(recordedCommand(small), small);
  const std::string quotes(120000, '"');
  const std::vector<std::string> big = {"sh", "-c", "true", quotes, quotes};
  const auto kept = recordedCommand(big);
  ASSERT_EQ(kept.size(), 5U);  // sh, -c, true, what fits of the quotes, the note
  EXPECT_EQ(kept[3].size(), 8192U - 4 * 8U - 8U);  // each argument costs 8 bytes more
  EXPECT_EQ(kept[4], "[1 more arguments, " + std::to_string(240000 - kept[3].size()) +
                         " more bytes not recorded]");
  // Many empty arguments are bounded too (each is a few bytes of JSON).
  const std::vector<std::string> empties(150000, "");
  const auto few = recordedCommand(empties);
  EXPECT_LE(few.size(), 8192U / 8U + 1U);
  EXPECT_EQ(few.back(), "[" + std::to_string(150000 - (few.size() - 1)) +
                            " more arguments, 0 more bytes not recorded]");

  TempDir tmp;
  const std::string id = newAgentId();
  const std::string dir = createStateDir(tmp.path() + "/root", id);
  AgentRecord rec = sampleRecord(dir, id);
  rec.command = {"printf", "\xff\xfe", std::string(2 << 20, '\x01')};  // not UTF-8; escapes
  rec.command.resize(200000);                                          // and many arguments
  ASSERT_NO_THROW(writeRecord(rec));
  EXPECT_LT(fs::file_size(dir + "/agent.json"), size_t{64} << 10);
  const auto back = readRecord(dir);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->id, id);
  EXPECT_EQ(back->command[1], "\xEF\xBF\xBD\xEF\xBF\xBD");  // U+FFFD twice
}

TEST(RecordTest, AnUnreadableRecordIsStillARecordForGc) {
  TempDir tmp;
  ScopedEnv env("TMPDIR", tmp.path().c_str());
  const std::string root = stateRoot("host");
  const std::string id = newAgentId();
  const std::string dir = createStateDir(root, id);
  EXPECT_FALSE(hasRecordFile(dir));
  std::ofstream(dir + "/agent.json") << "{ not a record";
  EXPECT_TRUE(hasRecordFile(dir));
  EXPECT_FALSE(readRecord(dir).has_value());
  std::vector<std::string> unreadable;
  for (const auto& r : readRecords(&unreadable)) EXPECT_NE(r.id, id);
  EXPECT_EQ(unreadable, std::vector<std::string>{dir});
}

TEST(RunnerAliveTest, ByPidAndStartTime) {
  AgentRecord rec = sampleRecord("/x", newAgentId());
  EXPECT_TRUE(runnerAlive(rec));
  rec.runner_starttime += 1;  // the pid was reused by another process
  EXPECT_FALSE(runnerAlive(rec));
  rec.runner_pid = -1;
  EXPECT_FALSE(runnerAlive(rec));
  // A process that has exited.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  const uint64_t start = processStartTime(child);
  int status;
  ::waitpid(child, &status, 0);
  rec.runner_pid = child;
  rec.runner_starttime = start;
  EXPECT_FALSE(runnerAlive(rec));
}

TEST(ProcessStartTimeTest, ZombiesAndMissingProcessesAreZero) {
  EXPECT_NE(processStartTime(::getpid()), 0U);
  EXPECT_EQ(processStartTime(-1), 0U);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  // Until reaped it is a zombie: not alive.
  for (int i = 0; i < 500 && processStartTime(child) != 0; ++i) ::usleep(10000);
  EXPECT_EQ(processStartTime(child), 0U);
  int status;
  ::waitpid(child, &status, 0);
}

TEST(RemoveStateDirTest, RemovesEverythingButNeverFollowsSymlinks) {
  TempDir tmp;
  const std::string outside = tmp.path() + "/outside";
  fs::create_directory(outside);
  std::ofstream(outside + "/keep") << "keep";
  const std::string dir = createStateDir(tmp.path() + "/root", newAgentId());
  fs::create_directories(dir + "/home/a/b/c");
  std::ofstream(dir + "/home/a/b/c/file") << "x";
  fs::create_directory_symlink(outside, dir + "/home/link-to-outside");
  fs::create_symlink(outside + "/keep", dir + "/home/a/file-link");
  // Directories the agent made unreadable and unwritable are still removed.
  fs::create_directories(dir + "/home/locked/inner");
  ::chmod((dir + "/home/locked/inner").c_str(), 0);
  ::chmod((dir + "/home/locked").c_str(), 0500);
  removeStateDir(dir + "/");
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::exists(outside + "/keep"));
  // Missing is not an error (gc and the runner may both try).
  EXPECT_NO_THROW(removeStateDir(dir));
}

TEST(RemoveStateDirTest, AStateRootSwappedForASymlinkIsNotFollowed) {
  // A user's own root replaced by a symlink between gc's reading and its removal: root's gc
  // must not remove an entry of that name wherever the link points.
  TempDir tmp;
  const std::string elsewhere = tmp.path() + "/elsewhere";
  const std::string id = newAgentId();
  fs::create_directories(elsewhere + "/" + id);
  fs::create_directory_symlink(elsewhere, tmp.path() + "/root");
  EXPECT_THROW(removeStateDir(tmp.path() + "/root/" + id), RunnerError);
  EXPECT_TRUE(fs::exists(elsewhere + "/" + id));
}

TEST(RemoveStateDirTest, RefusesNonsensePaths) {
  for (const char* bad : {"", "/", "relative/dir", "/tmp/..", "/tmp/."}) {
    EXPECT_THROW(removeStateDir(bad), RunnerError) << bad;
  }
}

}  // namespace
}  // namespace runner
