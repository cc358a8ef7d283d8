set(FUZZ_LIBS policy)
