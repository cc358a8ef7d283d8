set(FUZZ_LIBS sam_box_lib)
