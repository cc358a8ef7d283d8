#include "sam-box/relay.h"

#include <unistd.h>

namespace sambox {

void makePipe(common::UniqueFd* read_end, common::UniqueFd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::system_category(), "pipe2(O_NONBLOCK|O_CLOEXEC)");
  }
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
}

}  // namespace sambox
