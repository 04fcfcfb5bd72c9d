# Runs COMMAND_A and COMMAND_B (lists separated by ';'); passes when both print "OK <digest>" (or
# what PATTERN matches, its first group being the digest) with the same digest.
if(NOT DEFINED PATTERN)
  set(PATTERN "OK ([0-9a-f]+)")
endif()
foreach(side A B)
  execute_process(COMMAND ${COMMAND_${side}} RESULT_VARIABLE exit_code OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT exit_code STREQUAL "0" OR NOT out MATCHES "${PATTERN}")
    message(FATAL_ERROR "command ${side} failed (exit ${exit_code}):\n${out}${err}")
  endif()
  set(digest_${side} "${CMAKE_MATCH_1}")
endforeach()
if(NOT digest_A STREQUAL digest_B)
  message(FATAL_ERROR "digests differ: ${digest_A} vs ${digest_B}")
endif()
message(STATUS "ok: both digests are ${digest_A}")
