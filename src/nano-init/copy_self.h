#pragma once
// `nano-init copy DEST`: the image needs nothing else (issue 3 "Commands").

#include <string>

namespace nanoinit {

/// Copies /proc/self/exe to `dest` with mode 0755, via a temporary file in the same
/// directory and rename(2), so DEST is never a half-written binary. Throws StepError.
void copySelf(const std::string& dest);

}  // namespace nanoinit
