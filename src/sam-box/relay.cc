#include "sam-box/relay.h"

#include <unistd.h>

namespace sambox {

PipePool::Pipe PipePool::acquire() {
  if (!idle_.empty()) {
    Pipe pipe = std::move(idle_.back());
    idle_.pop_back();
    return pipe;
  }
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::system_category(), "pipe2(O_NONBLOCK|O_CLOEXEC)");
  }
  Pipe pipe;
  pipe.read_end.reset(fds[0]);
  pipe.write_end.reset(fds[1]);
  (void)::fcntl(pipe.write_end.get(), F_SETPIPE_SZ, static_cast<int>(pipe_bytes_));
  return pipe;
}

void PipePool::release(Pipe pipe) {
  if (!pipe.valid() || idle_.size() >= max_idle_) return;  // closed by Pipe's destructor
  idle_.push_back(std::move(pipe));
}

}  // namespace sambox
