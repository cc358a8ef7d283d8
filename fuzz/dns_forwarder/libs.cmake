set(FUZZ_LIBS runner_lib)
