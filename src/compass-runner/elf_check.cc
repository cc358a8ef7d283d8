// elf_check.h: the program headers of an ELF file, read for PT_INTERP.
#include "compass-runner/elf_check.h"

#include <elf.h>

#include <cstdint>
#include <fstream>
#include <string_view>

namespace runner {

bool isStaticElf(const std::string& path) noexcept {
  try {
    std::ifstream in(path, std::ios::binary);
    Elf64_Ehdr eh{};
    if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh) ||
        std::string_view(reinterpret_cast<const char*>(eh.e_ident), SELFMAG) != ELFMAG ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize < sizeof(Elf64_Phdr)) {
      return false;
    }
    for (int i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph{};
      in.seekg(static_cast<std::streamoff>(eh.e_phoff + uint64_t(i) * eh.e_phentsize));
      if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) return false;
      if (ph.p_type == PT_INTERP) return false;
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace runner
