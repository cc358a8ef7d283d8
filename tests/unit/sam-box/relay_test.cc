#include "sam-box/relay.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <unistd.h>

namespace sambox {
namespace {

int pipeSize(const PipePool::Pipe& p) { return ::fcntl(p.write_end.get(), F_GETPIPE_SZ); }

TEST(PipePoolTest, NewPipeIsNonBlockingCloseOnExecAndSized) {
  PipePool pool(256 * 1024, 4);
  PipePool::Pipe p = pool.acquire();
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(::fcntl(p.read_end.get(), F_GETFL) & O_NONBLOCK);
  EXPECT_TRUE(::fcntl(p.write_end.get(), F_GETFL) & O_NONBLOCK);
  EXPECT_TRUE(::fcntl(p.read_end.get(), F_GETFD) & FD_CLOEXEC);
  // Best effort: an unprivileged user past its pipe budget keeps the default size.
  EXPECT_GE(pipeSize(p), 64 * 1024);
}

TEST(PipePoolTest, ReleasedPipeIsReused) {
  PipePool pool(64 * 1024, 4);
  PipePool::Pipe p = pool.acquire();
  const int r = p.read_end.get();
  const int w = p.write_end.get();
  pool.release(std::move(p));
  EXPECT_EQ(pool.idle(), 1U);
  PipePool::Pipe again = pool.acquire();
  EXPECT_EQ(again.read_end.get(), r);
  EXPECT_EQ(again.write_end.get(), w);
  EXPECT_EQ(pool.idle(), 0U);
}

TEST(PipePoolTest, KeepsAtMostMaxIdleAndClosesTheRest) {
  PipePool pool(64 * 1024, 2);
  std::vector<PipePool::Pipe> pipes;
  for (int i = 0; i < 4; ++i) pipes.push_back(pool.acquire());
  const int last_read_end = pipes.back().read_end.get();
  for (auto& p : pipes) pool.release(std::move(p));
  EXPECT_EQ(pool.idle(), 2U);
  EXPECT_EQ(::fcntl(last_read_end, F_GETFD), -1);  // closed, not leaked
}

TEST(PipePoolTest, ReleasingAnEmptyHandleIsANoOp) {
  PipePool pool(64 * 1024, 2);
  pool.release(PipePool::Pipe{});
  EXPECT_EQ(pool.idle(), 0U);
}

}  // namespace
}  // namespace sambox
