set(FUZZ_LIBS vdns)
