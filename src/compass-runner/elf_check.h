#pragma once
// Whether an executable is statically linked (elf(5)): the sandbox's first process (nano-init)
// and the microVM guest's busybox must not load any shared library, since the libraries they
// would load are the sandbox's own (the image's ld.so, libc and LD_PRELOAD).

#include <string>

namespace runner {

/// True if the file at `path` is a 64-bit ELF whose program headers hold no PT_INTERP (no
/// dynamic loader is named, so none runs). False for a dynamically linked ELF, a 32-bit one, a
/// file that is not ELF, or one that cannot be read; never throws.
bool isStaticElf(const std::string& path) noexcept;

}  // namespace runner
