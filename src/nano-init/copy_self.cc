#include "nano-init/copy_self.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include "common/unique_fd.h"
#include "nano-init/errors.h"

namespace nanoinit {

void copySelf(const std::string& dest) {
  common::UniqueFd in(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  if (!in.valid()) throwErrno("open(/proc/self/exe)");
  const std::string tmp = dest + ".nano-init-tmp";
  common::UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755));
  if (!out.valid()) throwErrno("open(" + tmp + ")");
  std::array<char, 1 << 16> buf{};
  while (true) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      ::unlink(tmp.c_str());
      throwErrno("read(/proc/self/exe)");
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(out.get(), buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0) {
        if (errno == EINTR) continue;
        ::unlink(tmp.c_str());
        throwErrno("write(" + tmp + ")");
      }
      done += w;
    }
  }
  // The umask must not make the copy unusable: the mode is part of the contract.
  if (::fchmod(out.get(), 0755) != 0 || ::fsync(out.get()) != 0) {
    ::unlink(tmp.c_str());
    throwErrno("fchmod/fsync(" + tmp + ")");
  }
  out.reset();
  if (::rename(tmp.c_str(), dest.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throwErrno("rename(" + tmp + ", " + dest + ")");
  }
}

}  // namespace nanoinit
