// elf_check.h over synthetic ELF files and a real dynamic executable.
#include "compass-runner/elf_check.h"

#include <elf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace runner {
namespace {

namespace fs = std::filesystem;

class ElfCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("elf-check-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An ELF64 header followed by program headers of `types`; `elf_class` for the header.
  std::string write(const std::string& name, const std::vector<uint32_t>& types,
                    unsigned char elf_class = ELFCLASS64, size_t truncate_to = 0) const {
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = elf_class;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_phoff = sizeof eh;
    eh.e_phentsize = sizeof(Elf64_Phdr);
    eh.e_phnum = static_cast<uint16_t>(types.size());
    std::string bytes(reinterpret_cast<const char*>(&eh), sizeof eh);
    for (uint32_t t : types) {
      Elf64_Phdr ph{};
      ph.p_type = t;
      bytes.append(reinterpret_cast<const char*>(&ph), sizeof ph);
    }
    if (truncate_to != 0) bytes.resize(truncate_to);
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  fs::path dir_;
};

TEST_F(ElfCheckTest, NoInterpreterIsStatic) {
  EXPECT_TRUE(isStaticElf(write("static", {PT_LOAD, PT_LOAD, PT_GNU_STACK})));
}

TEST_F(ElfCheckTest, AnInterpreterAnywhereIsDynamic) {
  EXPECT_FALSE(isStaticElf(write("dynamic", {PT_PHDR, PT_INTERP, PT_LOAD})));
  EXPECT_FALSE(isStaticElf(write("last", {PT_LOAD, PT_LOAD, PT_INTERP})));
}

TEST_F(ElfCheckTest, WhatCannotBeJudgedIsNotStatic) {
  EXPECT_FALSE(isStaticElf(write("elf32", {PT_LOAD}, ELFCLASS32)));
  // The header promises a PT_INTERP entry the file no longer holds.
  EXPECT_FALSE(isStaticElf(write("truncated", {PT_LOAD, PT_INTERP}, ELFCLASS64,
                                 sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr) + 8)));
  const std::string script = (dir_ / "script").string();
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  EXPECT_FALSE(isStaticElf(script));
  EXPECT_FALSE(isStaticElf((dir_ / "missing").string()));
  EXPECT_FALSE(isStaticElf(dir_.string()));  // a directory
}

TEST_F(ElfCheckTest, DebiansShellIsDynamic) {
  ASSERT_TRUE(fs::exists("/bin/dash"));
  EXPECT_FALSE(isStaticElf("/bin/dash"));
}

}  // namespace
}  // namespace runner
