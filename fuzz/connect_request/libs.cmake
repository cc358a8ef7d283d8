set(FUZZ_LIBS proto policy)
