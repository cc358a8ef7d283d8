set(FUZZ_LIBS sam_node_lib)
