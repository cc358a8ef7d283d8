# GuestRuleset's parsing of the guest's control lines, with the control channel it needs to
# exist (no guest ever connects: only onLine() is driven).
if(NOT TARGET microvm_guest_control)
  add_library(microvm_guest_control STATIC
              ${PROJECT_SOURCE_DIR}/src/compass-runner/microvm_egress.cc
              ${PROJECT_SOURCE_DIR}/src/compass-runner/microvm_control.cc)
  target_include_directories(microvm_guest_control PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(microvm_guest_control PUBLIC common)
endif()
set(FUZZ_LIBS microvm_guest_control)
