set(FUZZ_LIBS netstack)
