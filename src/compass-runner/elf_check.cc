// elf_check.h: the program headers of an ELF file, read for PT_INTERP with two pread(2) calls
// (the runner checks nano-init on every podman start; a buffered stream read 8 KiB per header).
#include "compass-runner/elf_check.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace runner {
namespace {

// More program headers than any real executable has (ld writes about a dozen).
constexpr size_t kMaxHeaderBytes = size_t{64} * 1024;

bool readAt(int fd, void* buf, size_t size, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool isStaticElf(const std::string& path) noexcept {
  try {
    const common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return false;
    Elf64_Ehdr eh{};
    if (!readAt(fd.get(), &eh, sizeof eh, 0) ||
        std::string_view(reinterpret_cast<const char*>(eh.e_ident), SELFMAG) != ELFMAG ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize < sizeof(Elf64_Phdr)) {
      return false;
    }
    const size_t table = size_t{eh.e_phnum} * eh.e_phentsize;
    if (table > kMaxHeaderBytes) return false;
    std::vector<char> headers(table);
    if (!readAt(fd.get(), headers.data(), table, eh.e_phoff)) return false;
    for (size_t i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph{};
      std::memcpy(&ph, headers.data() + i * eh.e_phentsize, sizeof ph);
      if (ph.p_type == PT_INTERP) return false;
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace runner
